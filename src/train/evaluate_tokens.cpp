// What the per-token evaluations (masked LM, token classification) share: the evaluation data in
// batches through the inference forward (the encoder on the real tokens with --skip-padding, the
// head on the padded layout), each batch's per-token logits read as floats.
#include <algorithm>
#include <chrono>

#include "data/dataset.h"
#include "train/evaluate.h"

namespace anatomy {

void download_logits(Backend& be, const Tensor& logits, std::vector<float>& out) {
  out.resize(logits.numel());
  if (logits.dtype == DType::F32) {
    be.download(out.data(), logits);
    return;
  }
  ANATOMY_CHECK(logits.dtype == DType::BF16 || logits.dtype == DType::F16, "evaluate: logits of dtype ",
                dtype_name(logits.dtype), " cannot be read");
  std::vector<uint16_t> half(logits.numel());
  be.download(half.data(), logits);
  for (size_t i = 0; i < half.size(); ++i)
    out[i] = logits.dtype == DType::BF16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
}

EvalResult evaluate_per_token(EncoderModel& model, const Dataset& ds, const EvalOptions& opt,
                              const TokenBatchVisitor& visit) {
  const auto t0 = std::chrono::steady_clock::now();
  Backend& be = model.backend();
  const size_t n = ds.size();
  ANATOMY_CHECK(n > 0, "evaluate: the evaluation data has no samples");
  const std::vector<int64_t> lengths = opt.lengths.empty() ? ds.lengths() : opt.lengths;
  ANATOMY_CHECK(lengths.empty() || lengths.size() == n, "evaluate: ", lengths.size(), " lengths for ", n, " samples");
  const int64_t max_seq = model.shape().max_seq, B = std::min(opt.batch_size, model.shape().max_batch);
  EvalResult r;
  r.samples = static_cast<int64_t>(n);
  r.batch_size = B;
  r.labelled = opt.labelled;
  r.skip_padding = opt.skip_padding;
  r.predictions.assign(n, 0);
  r.labels.assign(n, 0);
  r.losses.assign(n, 0.0);
  Allocator& al = be.allocator();
  Buffer ids(al, DType::I32, {B * max_seq}, Category::Other), types(al, DType::I32, {B * max_seq}, Category::Other),
      mask(al, DType::I32, {B * max_seq}, Category::Other), rows, first;
  if (opt.skip_padding) {  // the packing index (Note [packed training] in model/bert.cpp: the heads read padded)
    rows = Buffer(al, DType::I32, {B * max_seq}, Category::Other);
    first = Buffer(al, DType::I32, {B + 1}, Category::Other);
  }
  HostBatch hb;
  std::vector<float> logits;
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(B)) {
    const size_t end = std::min(n, begin + static_cast<size_t>(B));
    const int64_t b = static_cast<int64_t>(end - begin);
    int64_t T = ds.seq_len();
    if (!lengths.empty()) {  // padded to the batch's longest sample, rounded up to the multiple
      T = 1;
      for (size_t k = begin; k < end; ++k) T = std::max(T, lengths[k]);
      const int64_t m = std::max<int64_t>(1, opt.pad_to_multiple_of);
      T = std::min(max_seq, (T + m - 1) / m * m);
    }
    hb.resize(b, T);
    for (size_t k = begin; k < end; ++k) ds.get(k, hb, static_cast<int64_t>(k - begin));
    be.set_phase(Phase::Data);
    DeviceBatch db{front(ids, b, T), front(types, b, T), front(mask, b, T), Tensor()};
    be.upload(db.input_ids, hb.input_ids.data());
    be.upload(db.token_type_ids, hb.token_type_ids.data());
    be.upload(db.attention_mask, hb.attention_mask.data());
    const int64_t packing = opt.skip_padding ? pack_evaluation_batch(be, hb, db, rows, first, opt) : b * T;
    model.forward_eval(db);
    // The model may compute padded all the same (Note [modernbert packed tokens]).
    const int64_t computed = packing < b * T && model.last_forward_packed() ? packing : b * T;
    r.packed_batches += computed < b * T;
    be.set_phase(Phase::Data);
    download_logits(be, model.logits().slice(0, b * T), logits);
    r.padded_tokens += b * T;
    r.computed_tokens += computed;
    for (int32_t m : hb.attention_mask) r.tokens += m != 0;
    visit(r, hb, logits, begin, T);
    ++r.batches;
  }
  be.synchronize();
  r.runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.samples_per_second = static_cast<double>(n) / std::max(r.runtime, 1e-9);
  return r;
}

}  // namespace anatomy
