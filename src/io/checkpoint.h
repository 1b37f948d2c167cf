// Hugging Face model directories: config.json + model.safetensors with HF parameter names.
#pragma once
#include <string>
#include <vector>

#include "model/encoder.h"

namespace anatomy {

// Writes DIR/config.json and DIR/model.safetensors (each atomically; DIR is created).
void save_pretrained(const std::string& dir, EncoderModel& model);

struct LoadReport {
  std::vector<std::string> newly_initialized;  // in the model, absent from the file
  std::vector<std::string> unused;             // in the file, not used by the model
  // With ignore_mismatched_sizes: "name: found shape [..] in the checkpoint and [..] in the model".
  std::vector<std::string> mismatched;
};

// Reads the weights of PATH (a directory holding model.safetensors, or the file itself) into
// the model's master weights; a tensor holding NaN or Inf is refused, named. Parameters missing from the file keep their current values and
// are reported, as transformers reports newly initialized weights.
// A tensor whose shape differs from the model's is refused, naming --ignore-mismatched-sizes;
// with ignore_mismatched_sizes it keeps its initial values and is reported in `mismatched`.
LoadReport load_pretrained_weights(const std::string& path, EncoderModel& model,
                                   bool ignore_mismatched_sizes = false);

// The names a parameter may carry in a checkpoint, most specific first: the
// *ForSequenceClassification name, the base model's name (no "bert.", "roberta.", "distilbert."
// or "electra." prefix), and the legacy
// LayerNorm.gamma / LayerNorm.beta spellings of either.
std::vector<std::string> checkpoint_names_for(const std::string& name);

// config.json of a directory (or the config path itself). A directory is first checked with
// refuse_unreadable_weights.
std::string config_path_of(const std::string& path);

// A model directory without model.safetensors that holds weights in another format
// (pytorch_model.bin, TF, Flax, sharded safetensors) is refused, naming what it holds and how to
// convert it, rather than trained from random weights. One with no weights at all passes.
void refuse_unreadable_weights(const std::string& dir);

// Weights read from `file` must be finite: the error names the tensor and the first bad element.
void refuse_non_finite(const std::string& file, const std::string& tensor, const float* v, size_t n);

}  // namespace anatomy
