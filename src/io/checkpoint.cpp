#include "io/checkpoint.h"

#include <filesystem>
#include <set>

#include "io/safetensors.h"

namespace anatomy {

namespace fs = std::filesystem;

std::string config_path_of(const std::string& path) {
  return fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
}

void save_pretrained(const std::string& dir, BertForSequenceClassification& model) {
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
  // As saved by BertForSequenceClassification, then by BertModel (no "bert." prefix), each also
  // with the legacy LayerNorm names (gamma for weight, beta for bias) of old TF-converted files.
  std::vector<std::string> bases{name};
  if (name.rfind("bert.", 0) == 0) bases.push_back(name.substr(5));
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

LoadReport load_pretrained_weights(const std::string& path, BertForSequenceClassification& model) {
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
    r.read(*found, DType::F32, host.data() + p.offset, shape, "config.json");
    used.insert(*found);
  }
  for (const auto& t : r.tensors())
    if (!used.count(t.name)) rep.unused.push_back(t.name);
  ANATOMY_CHECK(!used.empty(), file, ": none of its tensors is a BERT parameter with Hugging Face names");
  model.set_master_from_host(host);
  return rep;
}

}  // namespace anatomy
