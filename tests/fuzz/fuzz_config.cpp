// Arbitrary bytes as config.json: parse, BertConfig::from_json must accept (and validate) or
// throw anatomy::Error, and an accepted config must survive a to_json/from_json round trip.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_common.h"
#include "model/config.h"

using namespace anatomy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    BertConfig c = BertConfig::from_json(j, "fuzz");
    c.validate("fuzz");
    (void)c.num_parameters();
    BertConfig again = BertConfig::from_json(c.to_json(), "fuzz round trip");
    FUZZ_EXPECT(again == c);
  } catch (const Error&) {
  }
  return 0;
}
