#include "model/encoder.h"

#include "model/bert.h"

namespace anatomy {

std::unique_ptr<EncoderModel> make_model(Backend& be, const BertConfig& cfg, const ModelShape& shape) {
  return std::make_unique<BertForSequenceClassification>(be, cfg, shape);
}

}  // namespace anatomy
