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

LoadReport load_pretrained_weights(const std::string& path, BertForSequenceClassification& model) {
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "model.safetensors").string() : path;
  SafetensorsReader r = SafetensorsReader::open(file);
  std::vector<float> host = model.master_to_host();
  LoadReport rep;
  std::set<std::string> used;
  for (const auto& p : model.layout().params()) {
    if (!r.contains(p.name)) {
      rep.newly_initialized.push_back(p.name);
      continue;
    }
    std::vector<int64_t> shape(p.shape.d.begin(), p.shape.d.begin() + p.shape.rank);
    r.read(p.name, DType::F32, host.data() + p.offset, shape, "config.json");
    used.insert(p.name);
  }
  for (const auto& t : r.tensors())
    if (!used.count(t.name)) rep.unused.push_back(t.name);
  ANATOMY_CHECK(!used.empty(), file, ": none of its tensors is a BERT parameter with Hugging Face names");
  model.set_master_from_host(host);
  return rep;
}

}  // namespace anatomy
