#include "model/encoder.h"

#include "model/bert.h"
#include "model/modernbert.h"

namespace anatomy {

std::unique_ptr<EncoderModel> make_model(Backend& be, const BertConfig& cfg, const ModelShape& shape) {
  if (cfg.is_modernbert()) return std::make_unique<ModernBertForSequenceClassification>(be, cfg, shape);
  return std::make_unique<BertForSequenceClassification>(be, cfg, shape);
}

}  // namespace anatomy
