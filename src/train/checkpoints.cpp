#include "train/checkpoints.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/read_file.h"
#include "io/safetensors.h"

namespace anatomy {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kPrefix = "checkpoint-";
const char* const kFiles[] = {"config.json", "model.safetensors", kOptimizerFile};

std::string checkpoint_name(int64_t step) { return kPrefix + std::to_string(step); }

// "checkpoint-<digits><rest>": the step (canonical decimal, no sign or leading zeros) and rest.
std::optional<int64_t> parse_checkpoint_name(const std::string& name, std::string* rest) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const char* begin = name.data() + std::strlen(kPrefix);
  const char* end = name.data() + name.size();
  int64_t step = -1;
  auto [p, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || step < 0 || p - begin != static_cast<ptrdiff_t>(std::to_string(step).size())) return std::nullopt;
  *rest = std::string(p, end);
  return step;
}

}  // namespace

// Note [checkpoint checksum]: 64-bit FNV-1a over little-endian 8-byte words (the tail byte by
// byte), then the length. Each step is a bijection of the running hash, so any change confined
// to one word is always detected; it runs near memory speed, unlike byte-wise FNV. It guards
// against damage, not against an adversary.
std::string checkpoint_file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ANATOMY_CHECK(in, path, ": cannot open to verify its checksum");
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = 0xcbf29ce484222325ull, total = 0;
  std::vector<char> buf(1 << 20);  // a multiple of 8: words never straddle two reads
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, buf.data() + i, 8);
      h = (h ^ w) * kPrime;
    }
    for (; i < n; ++i) h = (h ^ static_cast<uint8_t>(buf[i])) * kPrime;
    total += n;
  }
  ANATOMY_CHECK(in.eof(), path, ": read failed while verifying its checksum");
  h = (h ^ total) * kPrime;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

namespace {

std::vector<int64_t> dims(const Tensor& t) { return {t.shape.d.begin(), t.shape.d.begin() + t.shape.rank}; }

// trainer_state.json of `dir`, checked against the files it lists (sizes; checksums too when
// asked). Throws a one-line error naming the file at fault.
nlohmann::json read_state(const fs::path& dir, bool verify_checksums) {
  const std::string file = (dir / kStateFile).string();
  ANATOMY_CHECK(fs::exists(file), file, ": cannot open (not a training checkpoint?)");
  nlohmann::json st = nlohmann::json::parse(read_regular_file(file), nullptr, /*allow_exceptions=*/false);
  ANATOMY_CHECK(st.is_object(), file, ": not valid JSON (truncated or corrupt)");
  ANATOMY_CHECK(st.value("format_version", nlohmann::json()) == kCheckpointFormatVersion, file,
                ": format_version must be ", kCheckpointFormatVersion);
  ANATOMY_CHECK(st.contains("step") && st["step"].is_number_integer() && st.contains("trainer") &&
                    st.contains("files") && st["files"].is_object(),
                file, ": lacks step, files or trainer");
  ANATOMY_CHECK(st["step"].get<int64_t>() >= 0, file, ": step must be a non-negative integer, got ", st["step"].dump());
  for (const char* name : kFiles) {
    const std::string path = (dir / name).string();
    const nlohmann::json& f = st["files"].value(name, nlohmann::json());
    ANATOMY_CHECK(f.is_object() && f.value("bytes", nlohmann::json()).is_number_unsigned() &&
                      f.value("checksum", nlohmann::json()).is_string(),
                  file, ": no size and checksum for ", name);
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    ANATOMY_CHECK(!ec, path, ": missing from the checkpoint (", ec.message(), ")");
    ANATOMY_CHECK(size == f["bytes"].get<uint64_t>(), path, ": is ", size, " bytes, ", kStateFile, " says ",
                  f["bytes"].get<uint64_t>(), " (truncated or replaced)");
    if (verify_checksums)
      ANATOMY_CHECK(checkpoint_file_checksum(path) == f["checksum"].get<std::string>(), path,
                    ": checksum differs from the one in ", kStateFile, " (the file is corrupt)");
  }
  return st;
}

int64_t non_negative(const nlohmann::json& obj, const char* key, const std::string& file, const char* where = "") {
  const nlohmann::json& v = obj.value(key, nlohmann::json());
  ANATOMY_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, file, ": ", where, key,
                " must be a non-negative integer, got ", v.dump());
  return v.get<int64_t>();
}

double finite(const nlohmann::json& obj, const char* key, const std::string& file) {
  const nlohmann::json& v = obj.value(key, nlohmann::json());
  ANATOMY_CHECK(v.is_number() && std::isfinite(v.get<double>()), file, ": trainer.", key, " must be a finite number, got ",
                v.dump());
  return v.get<double>();
}

}  // namespace

// Note [trainer state checks]: the trainer continues from these numbers, so a value no run can
// have written (a negative or fractional step, 1e15 steps in a checkpoint whose optimizer took 3,
// a NaN loss sum) is refused here rather than resumed into a run that silently does nothing or
// divides by a negative count. The invariants are those of the trainer's own bookkeeping: every
// step is either an optimizer update or a skipped (fp16 overflow) step, every step consumes at
// least one sample, and the checkpoint's step names the step of its directory and of its trainer.
void validate_trainer_state(const nlohmann::json& tr, const std::string& file, int64_t step, int64_t optimizer_steps) {
  ANATOMY_CHECK(tr.is_object(), file, ": trainer must be an object, got ", tr.type_name());
  const char* in = "trainer.";
  const int64_t global = non_negative(tr, "global_step", file, in);
  ANATOMY_CHECK(global == step, file, ": trainer.global_step ", global, " disagrees with step ", step);
  const int64_t skipped = non_negative(tr, "skipped_steps", file, in);
  ANATOMY_CHECK(optimizer_steps + skipped == global, file, ": global_step ", global, " is not optimizer_steps ",
                optimizer_steps, " + skipped_steps ", skipped);
  const int64_t samples = non_negative(tr, "samples", file, in);
  ANATOMY_CHECK(samples >= global, file, ": trainer.samples ", samples, " is fewer than the ", global, " steps taken");
  non_negative(tr, "window_samples", file, in);
  non_negative(tr, "loss_scale_clean_steps", file, in);
  finite(tr, "loss_sum", file);
  finite(tr, "first_step_loss", file);
  finite(tr, "window_loss", file);
  ANATOMY_CHECK(finite(tr, "loss_scale", file) > 0, file, ": trainer.loss_scale must be positive, got ", tr["loss_scale"].dump());
  const nlohmann::json& fp = tr.value("fingerprint", nlohmann::json());
  ANATOMY_CHECK(fp.is_object(), file, ": trainer.fingerprint must be an object, got ", fp.dump());
  if (tr.contains("micro_batches")) {
    const int64_t micro = non_negative(tr, "micro_batches", file, in);
    const nlohmann::json& accum = fp.value("--gradient-accumulation-steps", nlohmann::json());
    ANATOMY_CHECK(accum.is_number_integer() && accum.get<int64_t>() >= 1, file,
                  ": trainer.fingerprint --gradient-accumulation-steps must be a positive integer, got ", accum.dump());
    ANATOMY_CHECK(micro / accum.get<int64_t>() == global && micro % accum.get<int64_t>() == 0, file,
                  ": trainer.micro_batches ", micro, " is not global_step ", global, " x --gradient-accumulation-steps ",
                  accum.get<int64_t>());
  }
}

namespace {

// Empty when `dir` is a complete checkpoint (of step `step`, when given), else why not.
std::string checkpoint_problem(const fs::path& dir, std::optional<int64_t> step = std::nullopt) {
  try {
    const int64_t saved = read_state(dir, false)["step"].get<int64_t>();
    return !step || saved == *step ? "" : str_cat((dir / kStateFile).string(), ": names step ", saved);
  } catch (const Error& e) {
    return e.what();
  }
}

// Removes `path` so that no crash leaves it half-removed under its own name: rename to a hidden
// trash name (durably), then delete.
void remove_via_trash(const fs::path& path) {
  const fs::path trash = path.parent_path() / (".trash-" + path.filename().string());
  std::error_code ec;
  fs::remove_all(trash, ec);
  fs::rename(path, trash, ec);
  ANATOMY_CHECK(!ec, path.string(), ": cannot move aside for removal: ", ec.message());
  fsync_parent_dir(trash.string());
  fs::remove_all(trash, ec);
  ANATOMY_CHECK(!ec, trash.string(), ": cannot remove: ", ec.message());
}

}  // namespace

std::string save_training_checkpoint(const std::string& output_dir, int64_t step, BertForSequenceClassification& model,
                                     Optimizer& opt, const nlohmann::json& trainer_state) {
  ANATOMY_CHECK(step >= 0, "internal error: checkpoint step ", step);
  const std::string path = (fs::path(output_dir) / checkpoint_name(step)).string();
  AtomicDir dir(path);
  save_pretrained(dir.staging(), model);

  const std::string kind = optimizer_name(opt.kind());
  const auto state = opt.state();
  std::vector<std::vector<uint8_t>> host(state.size());
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < state.size(); ++i) {
    const Tensor& t = state[i].second;
    host[i].resize(t.bytes());
    model.backend().download(host[i].data(), t);
    entries.push_back({state[i].first, t.dtype, dims(t), host[i].data()});
  }
  write_safetensors(dir.file(kOptimizerFile), entries,
                    {{"format", "anatomy-optimizer"}, {"optimizer", kind}, {"steps", std::to_string(opt.steps())}});
  host.clear();

  nlohmann::json files = nlohmann::json::object();
  for (const char* name : kFiles)
    files[name] = {{"bytes", static_cast<uint64_t>(fs::file_size(dir.file(name)))},
                   {"checksum", checkpoint_file_checksum(dir.file(name))}};
  const nlohmann::json st = {{"format_version", kCheckpointFormatVersion}, {"step", step}, {"optimizer", kind},
                             {"optimizer_steps", opt.steps()}, {"files", files}, {"trainer", trainer_state}};
  write_file_atomic(dir.file(kStateFile), st.dump(2) + "\n");
  dir.commit();
  return path;
}

void rotate_checkpoints(const std::string& output_dir, int64_t limit) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return;
  std::vector<std::pair<int64_t, fs::path>> complete;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    std::error_code dir_ec;
    if (!e.is_directory(dir_ec)) continue;
    const std::string name = e.path().filename().string();
    std::string rest;
    const std::optional<int64_t> step = parse_checkpoint_name(name, &rest);
    if (name.rfind(".trash-", 0) == 0 || (step && (rest.rfind(".tmp-", 0) == 0 || rest.rfind(".old-", 0) == 0)))
      stale.push_back(e.path());
    else if (step && rest.empty() && checkpoint_problem(e.path(), step).empty())
      complete.emplace_back(*step, e.path());
  }
  ANATOMY_CHECK(!ec, output_dir, ": cannot list checkpoints: ", ec.message());
  for (const fs::path& p : stale) {
    fs::remove_all(p, ec);
    ANATOMY_CHECK(!ec, p.string(), ": cannot remove a leftover of an interrupted save: ", ec.message());
  }
  if (limit <= 0 || static_cast<int64_t>(complete.size()) <= limit) return;
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + static_cast<size_t>(limit) < complete.size(); ++i) remove_via_trash(complete[i].second);
}

std::optional<std::string> latest_checkpoint(const std::string& output_dir) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return std::nullopt;
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    std::string rest;
    const std::optional<int64_t> step = parse_checkpoint_name(e.path().filename().string(), &rest);
    std::error_code dir_ec;
    if (step && rest.empty() && e.is_directory(dir_ec)) found.emplace_back(*step, e.path());
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [step, path] : found)  // incomplete or damaged: fall back to the next older one
    if (checkpoint_problem(path, step).empty()) return path.string();
  return std::nullopt;
}

std::string resolve_resume_path(const std::string& arg, const std::string& output_dir) {
  if (arg == "latest") {
    std::optional<std::string> p = latest_checkpoint(output_dir);
    ANATOMY_CHECK(p, "--resume-from-checkpoint latest: no complete checkpoint in ", output_dir);
    return *p;
  }
  ANATOMY_CHECK(!arg.empty() && fs::is_directory(arg), "--resume-from-checkpoint ", arg, ": not a directory");
  const std::string problem = checkpoint_problem(arg);
  ANATOMY_CHECK(problem.empty(), "--resume-from-checkpoint ", arg, ": not a complete checkpoint: ", problem);
  return arg;
}

nlohmann::json load_training_checkpoint(const std::string& dir_str, BertForSequenceClassification& model, Optimizer& opt) {
  const fs::path dir(dir_str);
  nlohmann::json st = read_state(dir, /*verify_checksums=*/true);
  const std::string state_file = (dir / kStateFile).string();
  const int64_t step = st["step"].get<int64_t>();
  std::string rest;
  const std::optional<int64_t> named = parse_checkpoint_name(dir.filename().string(), &rest);
  ANATOMY_CHECK(!named || !rest.empty() || *named == step, state_file, ": names step ", step, " but the directory is ",
                dir.filename().string());
  const int64_t optimizer_steps = non_negative(st, "optimizer_steps", state_file);
  validate_trainer_state(st["trainer"], state_file, step, optimizer_steps);
  const std::string config = (dir / "config.json").string();
  ANATOMY_CHECK(BertConfig::from_json_file(config) == model.config(), config,
                ": the checkpoint's model differs from the one being trained");

  // Optimizer state: every tensor present, same dtype and shape, nothing extra; read to the host.
  const std::string ofile = (dir / kOptimizerFile).string();
  SafetensorsReader r = SafetensorsReader::open(ofile);
  const std::string kind = optimizer_name(opt.kind());
  const auto md = r.metadata();
  const std::string saved = md.count("optimizer") ? md.at("optimizer") : "?";
  ANATOMY_CHECK(saved == kind, ofile, ": holds the state of the '", saved, "' optimizer, this run uses '", kind, "'");
  int64_t steps = -1;
  const std::string steps_str = md.count("steps") ? md.at("steps") : "";
  auto [p, ec] = std::from_chars(steps_str.data(), steps_str.data() + steps_str.size(), steps);
  ANATOMY_CHECK(ec == std::errc() && p == steps_str.data() + steps_str.size() && steps >= 0, ofile,
                ": metadata 'steps' must be a step count, got '", steps_str, "'");
  ANATOMY_CHECK(steps == optimizer_steps, ofile, ": metadata 'steps' is ", steps, ", ", kStateFile, " says optimizer_steps ",
                optimizer_steps);
  const auto state = opt.state();
  ANATOMY_CHECK(r.tensors().size() == state.size(), ofile, ": holds ", r.tensors().size(), " tensors, the ", kind,
                " optimizer has ", state.size());
  std::vector<std::vector<uint8_t>> host;
  for (const auto& [name, t] : state) {
    const SafetensorsTensorInfo& info = r.info(name);
    ANATOMY_CHECK(info.dtype == t.dtype && info.shape == dims(t), ofile, ": tensor '", name, "' is ",
                  dtype_name(info.dtype), " ", shape_str(info.shape), ", the optimizer's is ", dtype_name(t.dtype), " ",
                  shape_str(dims(t)));
    host.push_back(r.read_bytes(name));
    ANATOMY_CHECK(host.back().size() == t.bytes(), ofile, ": tensor '", name, "' has ", host.back().size(),
                  " bytes, expected ", t.bytes());
  }

  // Weights: exactly the model's parameters, F32, by their own names (stricter than load_pretrained_weights).
  const std::string wfile = (dir / "model.safetensors").string();
  SafetensorsReader w = SafetensorsReader::open(wfile);
  std::vector<float> weights = model.master_to_host();
  ANATOMY_CHECK(w.tensors().size() == model.layout().params().size(), wfile, ": holds ", w.tensors().size(),
                " tensors, the model has ", model.layout().params().size(), " parameters");
  for (const auto& prm : model.layout().params()) {
    ANATOMY_CHECK(w.info(prm.name).dtype == DType::F32, wfile, ": tensor '", prm.name, "' is ",
                  dtype_name(w.info(prm.name).dtype), ", master weights are F32");
    const std::vector<int64_t> shape(prm.shape.d.begin(), prm.shape.d.begin() + prm.shape.rank);
    w.read(prm.name, DType::F32, weights.data() + prm.offset, shape, "the model");
    refuse_non_finite(wfile, prm.name, weights.data() + prm.offset, static_cast<size_t>(prm.shape.numel()));
  }

  // Everything checked: apply. set_master_from_host also refreshes the compute copy.
  model.set_master_from_host(weights);
  for (size_t i = 0; i < state.size(); ++i) model.backend().upload(state[i].second, host[i].data());
  opt.set_steps(steps);
  return st["trainer"];
}

}  // namespace anatomy
