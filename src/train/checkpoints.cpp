#include "train/checkpoints.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/read_file.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace anatomy {

namespace fs = std::filesystem;

namespace {

// Note [two state files]: anatomy's own state (its manifest: step, files, checksums, the
// trainer's running totals) is anatomy_state.json, written last; trainer_state.json is the
// Trainer's TrainerState (log_history, global_step, best_model_checkpoint, ...) for the tools
// that read it. Checkpoints written before 2026-11-29 hold anatomy's state under that name.
constexpr const char* kStateFile = "anatomy_state.json";
constexpr const char* kTrainerStateFile = "trainer_state.json";

// The anatomy state file of a checkpoint: anatomy_state.json, or an older checkpoint's own
// trainer_state.json.
fs::path state_path(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / kStateFile, ec) && fs::exists(dir / kTrainerStateFile, ec)) return dir / kTrainerStateFile;
  return dir / kStateFile;
}
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

std::optional<int64_t> checkpoint_step_of(const std::string& name) {
  std::string rest;
  const std::optional<int64_t> step = parse_checkpoint_name(name, &rest);
  return step && rest.empty() ? step : std::nullopt;
}

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

struct ShardFile {
  std::string file;
  size_t begin = 0, end = 0;
};

// The optimizer's files of a checkpoint (Note [optimizer shards]); empty for the whole form.
std::vector<ShardFile> shard_files(const nlohmann::json& st, const std::string& file) {
  std::vector<ShardFile> out;
  if (!st.contains("optimizer_shards")) return out;
  const nlohmann::json& a = st["optimizer_shards"];
  ANATOMY_CHECK(a.is_array() && !a.empty(), file, ": optimizer_shards must be a non-empty list");
  size_t next = 0;
  for (const nlohmann::json& e : a) {
    ANATOMY_CHECK(e.is_object() && e.value("file", nlohmann::json()).is_string() &&
                      e.value("begin", nlohmann::json()).is_number_unsigned() &&
                      e.value("end", nlohmann::json()).is_number_unsigned(),
                  file, ": each of optimizer_shards needs file, begin and end");
    ShardFile s{e["file"].get<std::string>(), e["begin"].get<size_t>(), e["end"].get<size_t>()};
    ANATOMY_CHECK(s.begin == next && s.end >= s.begin && s.file.find('/') == std::string::npos, file,
                  ": optimizer_shards do not tile the state in order (", s.file, ")");
    next = s.end;
    out.push_back(s);
  }
  return out;
}

// Every file anatomy_state.json must list: config, model, and the optimizer's file(s).
std::vector<std::string> listed_files(const nlohmann::json& st, const std::string& file) {
  std::vector<std::string> names = {"config.json", "model.safetensors"};
  const std::vector<ShardFile> shards = shard_files(st, file);
  if (shards.empty()) names.push_back(kOptimizerFile);
  for (const ShardFile& s : shards) names.push_back(s.file);
  return names;
}

std::string shard_file_name(int rank) { return "optimizer-shard-" + std::to_string(rank) + ".safetensors"; }

// Writes the optimizer's state tensors to `path` with the metadata of a checkpoint.
void write_optimizer_file(const std::string& path, EncoderModel& model, Optimizer& opt,
                          std::map<std::string, std::string> metadata) {
  const auto state = opt.state();
  std::vector<std::vector<uint8_t>> host(state.size());
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < state.size(); ++i) {
    const Tensor& t = state[i].second;
    host[i].resize(t.bytes());
    model.backend().download(host[i].data(), t);
    entries.push_back({state[i].first, t.dtype, dims(t), host[i].data()});
  }
  metadata["format"] = "anatomy-optimizer";
  metadata["optimizer"] = optimizer_name(opt.kind());
  metadata["steps"] = std::to_string(opt.steps());
  write_safetensors(path, entries, metadata);
}

// The anatomy state file of `dir`, checked against the files it lists (sizes; checksums too when
// asked). Throws a one-line error naming the file at fault.
nlohmann::json read_state(const fs::path& dir, bool verify_checksums) {
  const std::string file = state_path(dir).string();
  ANATOMY_CHECK(fs::exists(file), file, ": cannot open (not a training checkpoint?)");
  nlohmann::json st = nlohmann::json::parse(read_regular_file(file), nullptr, /*allow_exceptions=*/false);
  ANATOMY_CHECK(st.is_object(), file, ": not valid JSON (truncated or corrupt)");
  ANATOMY_CHECK(st.value("format_version", nlohmann::json()) == kCheckpointFormatVersion, file,
                ": format_version must be ", kCheckpointFormatVersion);
  ANATOMY_CHECK(st.contains("step") && st["step"].is_number_integer() && st.contains("trainer") &&
                    st.contains("files") && st["files"].is_object(),
                file, ": lacks step, files or trainer");
  ANATOMY_CHECK(st["step"].get<int64_t>() >= 0, file, ": step must be a non-negative integer, got ", st["step"].dump());
  for (const std::string& name : listed_files(st, file)) {
    const std::string path = (dir / name).string();
    const nlohmann::json& f = st["files"].value(name, nlohmann::json());
    ANATOMY_CHECK(f.is_object() && f.value("bytes", nlohmann::json()).is_number_unsigned() &&
                      f.value("checksum", nlohmann::json()).is_string(),
                  file, ": no size and checksum for ", name);
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    ANATOMY_CHECK(!ec, path, ": missing from the checkpoint (", ec.message(), ")");
    const std::string manifest = fs::path(file).filename().string();  // anatomy_state.json, or an older name
    ANATOMY_CHECK(size == f["bytes"].get<uint64_t>(), path, ": is ", size, " bytes, ", manifest, " says ",
                  f["bytes"].get<uint64_t>(), " (truncated or replaced)");
    if (verify_checksums)
      ANATOMY_CHECK(checkpoint_file_checksum(path) == f["checksum"].get<std::string>(), path,
                    ": checksum differs from the one in ", manifest, " (the file is corrupt)");
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
    // Each step takes 1 to A micro-batches (Note [accumulation within an epoch] in train/step.h).
    ANATOMY_CHECK(micro >= global && (micro == 0 || (micro - 1) / accum.get<int64_t>() < global), file, ": trainer.micro_batches ", micro,
                  " is not global_step ", global, " steps of 1 to --gradient-accumulation-steps ", accum.get<int64_t>(),
                  " micro-batches");
  }
}

namespace {

// Empty when `dir` is a complete checkpoint (of step `step`, when given), else why not.
std::string checkpoint_problem(const fs::path& dir, std::optional<int64_t> step = std::nullopt) {
  try {
    const int64_t saved = read_state(dir, false)["step"].get<int64_t>();
    return !step || saved == *step ? "" : str_cat(state_path(dir).string(), ": names step ", saved);
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

void save_tokenizer_into(const std::string& dir, const TokenizerFiles& tokenizer) {
  for (const std::string& f : tokenizer.files) {
    const fs::path to = fs::path(dir) / fs::path(f).filename();
    std::error_code ec;
    if (fs::exists(to, ec) && fs::equivalent(to, f, ec)) continue;
    write_file_atomic(to.string(), read_regular_file(f));
  }
  if (!tokenizer.config.empty()) write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), tokenizer.config);
}

std::string save_training_checkpoint(const std::string& output_dir, int64_t step, EncoderModel& model,
                                     Optimizer& opt, const nlohmann::json& trainer_state,
                                     const TokenizerFiles& tokenizer, const nlohmann::json& hf_state) {
  ANATOMY_CHECK(step >= 0, "internal error: checkpoint step ", step);
  const std::string path = (fs::path(output_dir) / checkpoint_name(step)).string();
  AtomicDir dir(path);
  save_pretrained(dir.staging(), model);
  save_tokenizer_into(dir.staging(), tokenizer);
  if (!hf_state.is_null()) write_file_atomic(dir.file(kTrainerStateFile), hf_state.dump(2) + "\n");

  const std::string kind = optimizer_name(opt.kind());
  write_optimizer_file(dir.file(kOptimizerFile), model, opt, {});

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

std::string save_training_checkpoint(const std::string& output_dir, int64_t step, EncoderModel& model,
                                     Optimizer& opt, const nlohmann::json& trainer_state, Communicator& comm,
                                     const OptimizerPart& part, const TokenizerFiles& tokenizer,
                                     const nlohmann::json& hf_state) {
  const bool lead = comm.rank() == 0;
  const fs::path path = fs::path(output_dir) / checkpoint_name(step);
  if (!part.sharded) {  // the whole state is the same on every rank: rank 0 writes it
    if (lead) save_training_checkpoint(output_dir, step, model, opt, trainer_state, tokenizer, hf_state);
    comm.wait_for_all();  // as long as the writing takes
    return path.string();
  }
  // Each rank writes its shard beside the checkpoint (a name rotate_checkpoints clears as a
  // leftover); rank 0 then moves every shard into its staging directory and commits it.
  const fs::path side = fs::path(output_dir) / (checkpoint_name(step) + ".tmp-shards");
  std::error_code ec;
  if (lead) {
    fs::remove_all(side, ec);
    fs::create_directories(side, ec);
    ANATOMY_CHECK(!ec, side.string(), ": cannot create: ", ec.message());
  }
  comm.barrier();
  write_optimizer_file((side / shard_file_name(comm.rank())).string(), model, opt,
                       {{"begin", std::to_string(part.begin)}, {"end", std::to_string(part.end)}});
  std::vector<double> ranges(2 * static_cast<size_t>(comm.size()), 0.0);
  ranges[2 * static_cast<size_t>(comm.rank())] = static_cast<double>(part.begin);
  ranges[2 * static_cast<size_t>(comm.rank()) + 1] = static_cast<double>(part.end);
  comm.all_reduce_host(ranges, Communicator::Op::Sum);  // also: every shard is written
  if (lead) {
    AtomicDir dir(path.string());
    save_pretrained(dir.staging(), model);
    save_tokenizer_into(dir.staging(), tokenizer);
    if (!hf_state.is_null()) write_file_atomic(dir.file(kTrainerStateFile), hf_state.dump(2) + "\n");
    nlohmann::json shards = nlohmann::json::array(), files = nlohmann::json::object();
    for (int r = 0; r < comm.size(); ++r) {
      const std::string name = shard_file_name(r);
      fs::rename(side / name, dir.file(name), ec);
      ANATOMY_CHECK(!ec, (side / name).string(), ": cannot move into the checkpoint: ", ec.message());
      shards.push_back({{"file", name},
                        {"begin", static_cast<uint64_t>(ranges[2 * static_cast<size_t>(r)])},
                        {"end", static_cast<uint64_t>(ranges[2 * static_cast<size_t>(r) + 1])}});
    }
    nlohmann::json st = {{"format_version", kCheckpointFormatVersion}, {"step", step}, {"optimizer", optimizer_name(opt.kind())},
                         {"optimizer_steps", opt.steps()}, {"optimizer_shards", shards}, {"trainer", trainer_state}};
    for (const std::string& name : listed_files(st, kStateFile))
      files[name] = {{"bytes", static_cast<uint64_t>(fs::file_size(dir.file(name)))},
                     {"checksum", checkpoint_file_checksum(dir.file(name))}};
    st["files"] = files;
    write_file_atomic(dir.file(kStateFile), st.dump(2) + "\n");
    dir.commit();
    fs::remove_all(side, ec);
  }
  comm.wait_for_all();  // as long as rank 0's writing takes
  return path.string();
}

void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep) {
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
  if (!keep.empty()) {
    const auto best = std::find_if(complete.begin(), complete.end(), [&](const auto& c) {
      std::error_code eq;  // the best is one of output_dir's own: its name identifies it
      return c.second.filename() == fs::path(keep).filename() || fs::equivalent(c.second, keep, eq);
    });
    if (best != complete.end()) {
      complete.erase(best);
      limit = std::max<int64_t>(1, limit - 1);
    }
  }
  for (size_t i = 0; i + static_cast<size_t>(limit) < complete.size(); ++i) remove_via_trash(complete[i].second);
}

std::optional<std::string> latest_checkpoint(const std::string& output_dir, std::vector<std::string>* skipped) {
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
  for (const auto& [step, path] : found) {  // incomplete or damaged: fall back to the next older one
    const std::string problem = checkpoint_problem(path, step);
    if (problem.empty()) return path.string();
    if (skipped) skipped->push_back(str_cat(path.filename().string(), " (", problem, ")"));
  }
  return std::nullopt;
}

std::string resolve_resume_path(const std::string& arg, const std::string& output_dir, std::vector<std::string>* skipped) {
  if (arg == "latest") {
    std::vector<std::string> passed;
    std::optional<std::string> p = latest_checkpoint(output_dir, &passed);
    std::string why;
    for (const std::string& s : passed) why += (why.empty() ? "; passed over " : ", ") + s;
    ANATOMY_CHECK(p, "--resume-from-checkpoint latest: no complete checkpoint in ", output_dir, why);
    if (skipped) *skipped = std::move(passed);
    return *p;
  }
  ANATOMY_CHECK(!arg.empty() && fs::is_directory(arg), "--resume-from-checkpoint ", arg, ": not a directory");
  const std::string problem = checkpoint_problem(arg);
  ANATOMY_CHECK(problem.empty(), "--resume-from-checkpoint ", arg, ": not a complete checkpoint: ", problem);
  return arg;
}

namespace {

// Optimizer state as host bytes, in the order of opt.state(), and its step count.
struct HostState {
  std::vector<std::vector<uint8_t>> tensors;
  int64_t steps = -1;
};

// The optimizer's kind and step count from a state file's metadata.
int64_t read_optimizer_meta(const SafetensorsReader& r, const Optimizer& opt) {
  const std::string& ofile = r.path();
  const std::string kind = optimizer_name(opt.kind());
  const auto md = r.metadata();
  const std::string saved = md.count("optimizer") ? md.at("optimizer") : "?";
  ANATOMY_CHECK(saved == kind, ofile, ": holds the state of the '", saved, "' optimizer, this run uses '", kind, "'");
  int64_t steps = -1;
  const std::string steps_str = md.count("steps") ? md.at("steps") : "";
  auto [p, ec] = std::from_chars(steps_str.data(), steps_str.data() + steps_str.size(), steps);
  ANATOMY_CHECK(ec == std::errc() && p == steps_str.data() + steps_str.size() && steps >= 0, ofile,
                ": metadata 'steps' must be a step count, got '", steps_str, "'");
  return steps;
}

// The whole form into a whole optimizer: every tensor present, same dtype and shape, nothing extra.
HostState read_whole_state(const std::string& ofile, Optimizer& opt) {
  SafetensorsReader r = SafetensorsReader::open(ofile);
  HostState hs;
  hs.steps = read_optimizer_meta(r, opt);
  const auto state = opt.state();
  ANATOMY_CHECK(r.tensors().size() == state.size(), ofile, ": holds ", r.tensors().size(), " tensors, the ",
                optimizer_name(opt.kind()), " optimizer has ", state.size());
  for (const auto& [name, t] : state) {
    const SafetensorsTensorInfo& info = r.info(name);
    ANATOMY_CHECK(info.dtype == t.dtype && info.shape == dims(t), ofile, ": tensor '", name, "' is ",
                  dtype_name(info.dtype), " ", shape_str(info.shape), ", the optimizer's is ", dtype_name(t.dtype), " ",
                  shape_str(dims(t)));
    hs.tensors.push_back(r.read_bytes(name));
    ANATOMY_CHECK(hs.tensors.back().size() == t.bytes(), ofile, ": tensor '", name, "' has ", hs.tensors.back().size(),
                  " bytes, expected ", t.bytes());
  }
  return hs;
}

// Elements [begin, end) of every flat F32 state tensor, assembled from the saved parts (Note
// [optimizer shards]).
HostState read_state_range(const std::vector<ShardFile>& parts, Optimizer& opt, size_t begin, size_t end) {
  const auto state = opt.state();
  HostState hs;
  hs.tensors.resize(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    const Tensor& t = state[i].second;
    ANATOMY_CHECK(t.dtype == DType::F32 && t.shape.rank == 1 && static_cast<size_t>(t.numel()) == end - begin,
                  "--optim ", optimizer_name(opt.kind()), ": its state cannot be resharded (AdamW and SGD only)");
    hs.tensors[i].resize(t.bytes());
  }
  for (const ShardFile& part : parts) {
    const size_t lo = std::max(begin, part.begin), hi = std::min(end, part.end);
    SafetensorsReader r = SafetensorsReader::open(part.file);
    const int64_t steps = read_optimizer_meta(r, opt);
    ANATOMY_CHECK(hs.steps < 0 || steps == hs.steps, part.file, ": metadata 'steps' ", steps, " differs from the other shards' ",
                  hs.steps);
    hs.steps = steps;
    ANATOMY_CHECK(r.tensors().size() == state.size(), part.file, ": holds ", r.tensors().size(), " tensors, the ",
                  optimizer_name(opt.kind()), " optimizer has ", state.size());
    if (lo >= hi) continue;
    for (size_t i = 0; i < state.size(); ++i) {
      const SafetensorsTensorInfo& info = r.info(state[i].first);
      const std::vector<int64_t> want = {static_cast<int64_t>(part.end - part.begin)};
      ANATOMY_CHECK(info.dtype == DType::F32 && info.shape == want, part.file, ": tensor '", state[i].first, "' is ",
                    dtype_name(info.dtype), " ", shape_str(info.shape), ", expected F32 ", shape_str(want));
      const std::vector<uint8_t> bytes = r.read_bytes(state[i].first);
      ANATOMY_CHECK(bytes.size() == want[0] * sizeof(float), part.file, ": tensor '", state[i].first, "' is short");
      std::memcpy(hs.tensors[i].data() + (lo - begin) * sizeof(float), bytes.data() + (lo - part.begin) * sizeof(float),
                  (hi - lo) * sizeof(float));
    }
  }
  ANATOMY_CHECK(hs.steps >= 0, "internal error: no optimizer shard read");
  return hs;
}

}  // namespace

nlohmann::json load_training_checkpoint(const std::string& dir_str, EncoderModel& model, Optimizer& opt) {
  return load_training_checkpoint(dir_str, model, opt, OptimizerPart{});
}

nlohmann::json load_training_checkpoint(const std::string& dir_str, EncoderModel& model, Optimizer& opt,
                                        const OptimizerPart& part) {
  const fs::path dir(dir_str);
  nlohmann::json st = read_state(dir, /*verify_checksums=*/true);
  const std::string state_file = state_path(dir).string();
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

  // Optimizer state, read to the host and checked.
  const size_t total = model.layout().total();
  std::vector<ShardFile> parts = shard_files(st, state_path(dir).string());
  for (ShardFile& p : parts) p.file = (dir / p.file).string();
  if (!parts.empty())
    ANATOMY_CHECK(parts.back().end == total, state_path(dir).string(), ": optimizer_shards cover ", parts.back().end,
                  " elements, the model has ", total);
  HostState hs;
  if (parts.empty() && !part.sharded) {
    hs = read_whole_state((dir / kOptimizerFile).string(), opt);
  } else {
    if (parts.empty()) parts.push_back({(dir / kOptimizerFile).string(), 0, total});
    hs = part.sharded ? read_state_range(parts, opt, part.begin, part.end) : read_state_range(parts, opt, 0, total);
  }
  ANATOMY_CHECK(hs.steps == optimizer_steps, state_file, ": optimizer_steps ", optimizer_steps,
                " disagrees with the optimizer state's metadata 'steps' ", hs.steps);

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
  const auto state = opt.state();
  for (size_t i = 0; i < state.size(); ++i) model.backend().upload(state[i].second, hs.tensors[i].data());
  opt.set_steps(hs.steps);
  return st["trainer"];
}

}  // namespace anatomy
