// Evaluation of the float-label problem types (regression, multi-label; Note [problem types] in
// model/heads.h): the per-sample loss as the device computes it, and how predictions are written.
#pragma once
#include <map>
#include <span>
#include <string>

#include "train/evaluate.h"

namespace anatomy {

// One sample's loss in double: mean over its columns of the squared error (regression) or of
// the binary cross-entropy with logits (multi-label), as mse_loss / bce_with_logits compute it.
double float_label_loss(ProblemType p, std::span<const float> logits, std::span<const float> targets);

// Sample i of r as a predictions.jsonl line: {"index", "prediction": the value (a list when
// num_labels > 1) or the predicted class names, "prediction_ids" (multi-label), "label" (the
// target, labelled only), "probabilities" (multi-label: the sigmoids)}.
std::string float_prediction_line(const EvalResult& r, int64_t i, const std::map<int, std::string>& id2label);
// predict_results.txt's prediction column, as run_glue.py / run_classification.py write it:
// the value with 3 decimals (regression; comma-separated when num_labels > 1), or the
// predicted class names joined by commas (multi-label).
std::string float_prediction_text(const EvalResult& r, int64_t i, const std::map<int, std::string>& id2label);

}  // namespace anatomy
