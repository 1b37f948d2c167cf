#include "io/checkpoint.h"

#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "io/read_file.h"
#include "io/safetensors.h"
#include "model/heads.h"

namespace anatomy {

namespace fs = std::filesystem;

std::string config_path_of(const std::string& path) {
  if (!fs::is_directory(path)) return path;
  refuse_unreadable_weights(path);
  return (fs::path(path) / "config.json").string();
}

void refuse_unreadable_weights(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "model.safetensors", ec)) return;
  // The names transformers' save_pretrained gives weights it can write but anatomy cannot read.
  std::string found;
  for (const char* name : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.safetensors.index.json",
                           "tf_model.h5", "flax_model.msgpack", "model.ckpt.index"})
    if (fs::exists(fs::path(dir) / name, ec)) found += (found.empty() ? "" : ", ") + std::string(name);
  if (found.empty()) return;
  // The class config.json names keeps every tensor the file holds (a masked-LM head too).
  std::string cls = "AutoModel";
  try {
    const nlohmann::json cfg = nlohmann::json::parse(read_regular_file((fs::path(dir) / "config.json").string()));
    if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
        cfg["architectures"][0].is_string())
      cls = cfg["architectures"][0].get<std::string>();
  } catch (const std::exception&) {
  }
  fail("--model-name-or-path ", dir, ": holds ", found, " but no model.safetensors, the only weights anatomy reads; "
       "convert it with transformers: ", cls, ".from_pretrained(DIR).save_pretrained(DIR, max_shard_size=\"100GB\") "
       "(one model.safetensors with every tensor)");
}

void refuse_non_finite(const std::string& file, const std::string& tensor, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    ANATOMY_CHECK(std::isfinite(v[i]), file, ": tensor '", tensor, "' holds ", v[i], " at element ", i,
                  "; a model with NaN or Inf weights cannot train or predict (was it saved from a diverged run?)");
}

void save_pretrained(const std::string& dir, EncoderModel& model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ANATOMY_CHECK(!ec, dir, ": cannot create the output directory: ", ec.message());
  std::vector<float> host = model.master_to_host();
  std::vector<SafetensorsEntry> entries;
  for (const auto& p : model.layout().params()) {
    std::vector<int64_t> shape(p.shape.d.begin(), p.shape.d.begin() + p.shape.rank);
    entries.push_back({p.name, DType::F32, shape, host.data() + p.offset});
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), entries, {{"format", "pt"}});
  model.config().save((fs::path(dir) / "config.json").string());
}

std::vector<std::string> checkpoint_names_for(const std::string& name) {
  // As saved by *ForSequenceClassification, then by the base model (no "bert.", "roberta.", ... prefix), each also
  // with the legacy LayerNorm names (gamma for weight, beta for bias) of old TF-converted files.
  std::vector<std::string> bases{name};
  for (const char* base : {"bert.", "roberta.", "distilbert.", "electra.", "model."})  // model.: ModernBERT's
    if (name.rfind(base, 0) == 0) bases.push_back(name.substr(std::char_traits<char>::length(base)));
  std::vector<std::string> out;
  for (const std::string& b : bases) {
    out.push_back(b);
    for (auto [from, to] : {std::pair<const char*, const char*>{"LayerNorm.weight", "LayerNorm.gamma"},
                            std::pair<const char*, const char*>{"LayerNorm.bias", "LayerNorm.beta"}}) {
      const size_t at = b.rfind(from);
      if (at != std::string::npos && at + std::string(from).size() == b.size())
        out.push_back(b.substr(0, at) + to);
    }
  }
  return out;
}

LoadReport load_pretrained_weights(const std::string& path, EncoderModel& model,
                                   bool ignore_mismatched_sizes) {
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "model.safetensors").string() : path;
  SafetensorsReader r = SafetensorsReader::open(file);
  std::vector<float> host = model.master_to_host();
  LoadReport rep;
  std::set<std::string> used;
  for (const auto& p : model.layout().params()) {
    const std::string* found = nullptr;
    const std::vector<std::string> names = checkpoint_names_for(p.name);
    for (const std::string& n : names)
      if (r.contains(n)) {
        found = &n;
        break;
      }
    if (!found) {
      rep.newly_initialized.push_back(p.name);
      continue;
    }
    std::vector<int64_t> shape(p.shape.d.begin(), p.shape.d.begin() + p.shape.rank);
    if (const std::vector<int64_t>& has = r.info(*found).shape; has != shape) {
      ANATOMY_CHECK(ignore_mismatched_sizes, file, ": tensor '", *found, "' has shape ", shape_str(has), ", the model's ",
                    p.name, " is ", shape_str(shape), " (from config.json and the data's labels); "
                    "--ignore-mismatched-sizes initializes it anew");
      rep.mismatched.push_back(str_cat(p.name, ": found shape ", shape_str(has), " in the checkpoint and ", shape_str(shape),
                                       " in the model instantiated"));
      used.insert(*found);
      continue;
    }
    r.read(*found, DType::F32, host.data() + p.offset, shape, "config.json");
    refuse_non_finite(file, *found, host.data() + p.offset, static_cast<size_t>(p.shape.numel()));
    used.insert(*found);
  }
  for (const auto& t : r.tensors())
    if (!used.count(t.name)) rep.unused.push_back(t.name);
  const BertConfig& cfg = model.config();
  ANATOMY_CHECK(!used.empty(), file, ": none of its tensors is a ",
                is_masked_lm(cfg)               ? masked_lm_class(cfg)
                : is_token_classification(cfg) ? token_classification_class(cfg)
                                               : cfg.sequence_classification_class(),
                " parameter with Hugging Face names");
  model.set_master_from_host(host);
  return rep;
}

}  // namespace anatomy
