#include "model/heads.h"

#include "core/error.h"
#include "model/encoder.h"

namespace anatomy {

ProblemType problem_type_of(const BertConfig& cfg) {
  if (cfg.problem_type) {
    const std::string& p = *cfg.problem_type;
    if (p == "regression") return ProblemType::Regression;
    if (p == "multi_label_classification") return ProblemType::MultiLabel;
    ANATOMY_CHECK(p == "single_label_classification", "config: unknown problem_type '", p, "'");
    return ProblemType::SingleLabel;
  }
  return cfg.num_labels == 1 ? ProblemType::Regression : ProblemType::SingleLabel;
}

const char* problem_type_name(ProblemType p) {
  switch (p) {
    case ProblemType::SingleLabel: return "single_label_classification";
    case ProblemType::Regression: return "regression";
    case ProblemType::MultiLabel: return "multi_label_classification";
  }
  return "?";
}

bool has_float_labels(ProblemType p) { return p != ProblemType::SingleLabel; }

bool is_masked_lm(const BertConfig& cfg) {
  if (cfg.architectures.empty()) return false;
  const std::string& a = cfg.architectures.front();
  const std::string tail = "ForMaskedLM";
  return a.size() > tail.size() && a.compare(a.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_token_classification(const BertConfig& cfg) {
  if (cfg.architectures.empty()) return false;
  const std::string& a = cfg.architectures.front();
  const std::string tail = "ForTokenClassification";
  return a.size() > tail.size() && a.compare(a.size() - tail.size(), tail.size(), tail) == 0;
}

std::string token_classification_class(const BertConfig& cfg) {
  const std::string seq = cfg.sequence_classification_class();
  return seq.substr(0, seq.size() - std::string("SequenceClassification").size()) + "TokenClassification";
}

bool has_token_labels(const BertConfig& cfg) { return is_masked_lm(cfg) || is_token_classification(cfg); }

std::string masked_lm_class(const BertConfig& cfg) {
  switch (cfg.architecture) {
    case Architecture::Bert: return "BertForMaskedLM";
    case Architecture::Roberta: return "RobertaForMaskedLM";
    case Architecture::XlmRoberta: return "XLMRobertaForMaskedLM";
    case Architecture::ModernBert: return "ModernBertForMaskedLM";
    case Architecture::DistilBert: return "DistilBertForMaskedLM";
    case Architecture::Electra: break;
  }
  fail("--task mlm: model_type '", cfg.model_type(), "' has no masked-LM head in anatomy (BERT, RoBERTa, XLM-R, DistilBERT and "
       "ModernBERT do; ELECTRA's masked LM is its generator, a model of its own, not built)");
}

void check_masked_lm_decoder(const BertConfig& cfg, const std::string& source) {
  ANATOMY_CHECK(!is_masked_lm(cfg) || cfg.tie_word_embeddings, source,
                ": tie_word_embeddings false: a masked-LM decoder of its own (lm_head.decoder) is not supported; "
                "anatomy ties the decoder to the word embeddings");
}

DType label_dtype(const BertConfig& cfg) {
  return !is_masked_lm(cfg) && has_float_labels(problem_type_of(cfg)) ? DType::F32 : DType::I32;
}

int64_t label_width(const BertConfig& cfg, int64_t seq) {
  if (has_token_labels(cfg)) return seq;
  return has_float_labels(problem_type_of(cfg)) ? cfg.num_labels : 1;
}

Shape label_shape(const BertConfig& cfg, int64_t batch, int64_t seq) {
  return label_width(cfg, seq) == 1 && label_dtype(cfg) == DType::I32 ? Shape{batch} : Shape{batch, label_width(cfg, seq)};
}

void sequence_loss(Backend& be, ProblemType p, const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                   const Tensor& labels, float grad_scale) {
  switch (p) {
    case ProblemType::SingleLabel: be.cross_entropy(losses, dlogits, logits, labels, grad_scale); return;
    case ProblemType::Regression: be.mse_loss(losses, dlogits, logits, labels, grad_scale); return;
    case ProblemType::MultiLabel: be.bce_with_logits(losses, dlogits, logits, labels, grad_scale); return;
  }
}

void first_token_rows(Backend& be, const Tensor& out, const Tensor& x, const DeviceBatch& b, bool packed) {
  if (packed)
    be.gather_rows(out, x, b.first_rows);
  else
    be.select_token(out, x.view({b.batch(), b.seq(), x.dim(1)}), 0);
}

void first_token_rows_backward(Backend& be, const Tensor& dx, const Tensor& dout, const DeviceBatch& b, bool packed) {
  if (packed) {
    be.fill(dx, 0.0f);
    be.scatter_rows(dx, dout, b.first_rows);
  } else {
    be.select_token_backward(dx.view({b.batch(), b.seq(), dx.dim(1)}), dout, 0);
  }
}

}  // namespace anatomy
