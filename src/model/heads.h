// The sequence-classification problem types of transformers' *ForSequenceClassification heads
// (one head, three losses) and how a batch's labels look for each.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "ops/backend.h"

namespace anatomy {

struct DeviceBatch;  // model/encoder.h

// Note [problem types]
// transformers picks the loss from config.problem_type, or when it is unset from num_labels and
// the labels' dtype on the first forward: num_labels 1 -> regression; integer labels ->
// single-label; anything else (floats) -> multi-label. anatomy decides before training, from the
// data (train/train_data.cpp: float labels -> regression, a list of labels per row ->
// multi-label, as run_classification.py does) and writes problem_type into config.json, so
// transformers and anatomy agree without looking at a batch. A model whose config.json names
// another problem type than its training data's is refused, unless --ignore-mismatched-sizes
// lets the data decide (run_classification.py sets problem_type from the data).
//   SingleLabel: labels I32 [B], softmax cross-entropy.
//   Regression:  labels F32 [B, C] (C = num_labels, usually 1), squared error.
//   MultiLabel:  labels F32 [B, C] multi-hot, binary cross-entropy with logits.
enum class ProblemType : uint8_t { SingleLabel, Regression, MultiLabel };

// From config.problem_type, else regression when num_labels is 1, else single-label.
ProblemType problem_type_of(const BertConfig& cfg);
const char* problem_type_name(ProblemType p);  // transformers' spelling
bool has_float_labels(ProblemType p);

// The device labels of a batch of `batch` x `seq` tokens: I32 [batch] (single-label), F32
// [batch, num_labels] (regression, multi-label), I32 [batch, seq] (masked-LM, token
// classification); label_width is
// the elements per sample.
DType label_dtype(const BertConfig& cfg);
Shape label_shape(const BertConfig& cfg, int64_t batch, int64_t seq);
int64_t label_width(const BertConfig& cfg, int64_t seq);

// Note [masked LM head]
// The model is a *ForMaskedLM when config.json's architectures names one (the trainer sets it
// for --task mlm). The head runs on every token's final hidden state x [R, H], as transformers
// builds it for BERT (cls.predictions) and RoBERTa / XLM-R (lm_head), the same arithmetic under
// two spellings:
//   h = LayerNorm(gelu(x Wd^T + bd));  logits = h E^T + b
// with E the word embeddings (the decoder is tied to them: no tensor of its own, as transformers
// writes the file) and b a bias of vocab_size. The loss is the cross-entropy over the masked
// tokens only (labels -100 elsewhere), averaged over them: per sequence the sum of its masked
// tokens' losses times B / masked (DeviceBatch::masked_tokens), so that the trainer's mean over
// sequences is transformers' mean over masked tokens (the trainer passes the count of the whole
// optimizer step instead: Note [labelled tokens per step] in train/step.cpp). The decoder's
// gradient into E is added after the embeddings' own backward (Note [gradients in freed
// activations] zeroes their range just before it), from the head's dlogits and h, which the
// activation plan keeps alive until then.
// DistilBERT and ELECTRA (whose generator is a different model) are refused by name; packed
// batches (--skip-padding) are not supported with this head.
bool is_masked_lm(const BertConfig& cfg);
// "BertForMaskedLM", "RobertaForMaskedLM", "XLMRobertaForMaskedLM", "ModernBertForMaskedLM"
// (Note [modernbert token head] in model/modernbert.cpp); throws for the others.
std::string masked_lm_class(const BertConfig& cfg);
// The masked-LM decoder is the word embeddings (transformers' default tie_word_embeddings true): a
// masked-LM model whose config unties them (a decoder of its own) is refused, naming `source`,
// rather than trained or evaluated with the tied one. Other heads never read the decoder.
void check_masked_lm_decoder(const BertConfig& cfg, const std::string& source);

// Note [token classification head]
// *ForTokenClassification (architectures names one; the trainer sets it for --task
// token-classification): dropout then classifier (Linear H -> num_labels) on every token, the
// same module under every variant's base prefix, no pooler (ModernBERT runs its head first:
// Note [modernbert token head] in model/modernbert.cpp). The loss is the cross-entropy over
// the tokens whose label is not -100 (the first sub-token of each word), averaged over them, as
// for the masked-LM head (DeviceBatch::masked_tokens counts them).
bool is_token_classification(const BertConfig& cfg);
std::string token_classification_class(const BertConfig& cfg);
// Labels per token I32 [B, T] (masked-LM or token classification).
bool has_token_labels(const BertConfig& cfg);

// The sequence heads' input: out [B, H] = the first token's row of each sequence of x, the
// batch's rows [B*T, H] padded, or its packed token rows (`packed`: DeviceBatch::first_rows).
// Backward: dx gets dout on those rows and zero on the others.
void first_token_rows(Backend& be, const Tensor& out, const Tensor& x, const DeviceBatch& b, bool packed);
void first_token_rows_backward(Backend& be, const Tensor& dx, const Tensor& dout, const DeviceBatch& b, bool packed);

// Per-sample losses F32 [B] and dlogits (may be undefined) for the batch's labels, by problem type.
void sequence_loss(Backend& be, ProblemType p, const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                   const Tensor& labels, float grad_scale);

}  // namespace anatomy
