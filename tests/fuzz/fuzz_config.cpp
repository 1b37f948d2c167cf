// Arbitrary bytes as config.json: BertConfig::from_json_file must accept (and validate) or throw
// anatomy::Error, and an accepted config must survive a to_json/from_json round trip.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_common.h"
#include "model/config.h"

using namespace anatomy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  try {
    BertConfig c = BertConfig::from_json_file(file.path());
    c.validate("fuzz");
    (void)c.num_parameters();
    BertConfig again = BertConfig::from_json(c.to_json(), "fuzz round trip");
    FUZZ_EXPECT(again == c);
  } catch (const Error& e) {
    FUZZ_EXPECT(e.what()[0] != '\0');
  }
  return 0;
}
