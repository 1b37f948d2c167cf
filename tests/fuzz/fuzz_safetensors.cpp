// Arbitrary bytes as a .safetensors file: open() must validate the header and either succeed or
// throw anatomy::Error; every tensor it accepts must then read back without a fault.
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "io/safetensors.h"

using namespace anatomy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  try {
    SafetensorsReader r = SafetensorsReader::open(file.path());
    for (const SafetensorsTensorInfo& t : r.tensors()) {
      FUZZ_EXPECT(t.begin <= t.end && t.end <= size);
      FUZZ_EXPECT(t.numel() * dtype_size(t.dtype) == t.bytes());
      FUZZ_EXPECT(r.find(t.name) == &t);
      std::vector<uint8_t> raw = r.read_bytes(t.name);
      FUZZ_EXPECT(raw.size() == t.bytes());
      for (DType to : {DType::F32, DType::I64}) {
        if (!can_convert(t.dtype, to)) continue;
        std::vector<uint8_t> dst(t.numel() * dtype_size(to) + 1);
        try {
          r.read(t.name, to, dst.data(), t.shape, "fuzz");
        } catch (const Error&) {  // an integer that does not fit
        }
      }
    }
  } catch (const Error& e) {
    FUZZ_EXPECT(e.what()[0] != '\0');
  }
  return 0;
}
