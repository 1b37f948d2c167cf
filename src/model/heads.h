// The sequence-classification problem types of transformers' *ForSequenceClassification heads
// (one head, three losses) and how a batch's labels look for each.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "ops/backend.h"

namespace anatomy {

// Note [problem types]
// transformers picks the loss from config.problem_type, or when it is unset from num_labels and
// the labels' dtype on the first forward: num_labels 1 -> regression; integer labels ->
// single-label; anything else (floats) -> multi-label. anatomy decides before training, from the
// data (train/train_data.cpp: float labels -> regression, a list of labels per row ->
// multi-label, as run_classification.py does) and writes problem_type into config.json, so
// transformers and anatomy agree without looking at a batch.
//   SingleLabel: labels I32 [B], softmax cross-entropy.
//   Regression:  labels F32 [B, C] (C = num_labels, usually 1), squared error.
//   MultiLabel:  labels F32 [B, C] multi-hot, binary cross-entropy with logits.
enum class ProblemType : uint8_t { SingleLabel, Regression, MultiLabel };

// From config.problem_type, else regression when num_labels is 1, else single-label.
ProblemType problem_type_of(const BertConfig& cfg);
const char* problem_type_name(ProblemType p);  // transformers' spelling
bool has_float_labels(ProblemType p);

// The device labels of a batch of `batch` samples: I32 [batch] or F32 [batch, num_labels].
DType label_dtype(ProblemType p);
Shape label_shape(ProblemType p, int64_t batch, int64_t num_labels);

// Per-sample losses F32 [B] and dlogits (may be undefined) for the batch's labels, by problem type.
void sequence_loss(Backend& be, ProblemType p, const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                   const Tensor& labels, float grad_scale);

}  // namespace anatomy
