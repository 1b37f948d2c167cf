// BERT embeddings: e [B*T, H] = word[ids] + pos[t] + type[type_ids], and the F32 table gradients.
//
// Determinism: dpos and dtype are exact functions of their inputs (fixed summation order: a
// thread owns (t, j) and walks the batch in order; token-type sums go through the two-stage
// reduce_partials). dword uses atomicAdd: tokens sharing an id add in a run-dependent order, so
// dword may differ between runs in the last bits (only for ids that repeat within the batch).
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTypesPerPass = 4;  // token types accumulated in registers per pass

struct EmbDims {
  int64_t batch, seq, hidden, vocab, max_pos, type_vocab;
};

// ---- kernels ------------------------------------------------------------------------------------
// Pack q of row r (W elements); an out-of-range id gives a NaN row so it cannot go unnoticed.
// Tables of type G: F32 (the master weights, Note [normalization parameters in fp32] in
// model/bert.cpp: the three rows are summed in fp32 and rounded once) or T.
template <class T, class G, int W>
__global__ void embedding_forward_kernel(T* __restrict__ e, const int32_t* __restrict__ ids,
                                         const int32_t* __restrict__ type_ids, const G* __restrict__ word,
                                         const G* __restrict__ pos, const G* __restrict__ type, EmbDims d) {
  using V = Pack<T, W>;
  const int64_t packs = d.hidden / W, rows = d.batch * d.seq;
  const size_t n = static_cast<size_t>(rows) * packs;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = static_cast<int64_t>(i / packs), q = static_cast<int64_t>(i % packs), t = r % d.seq;
    const int32_t id = ids[r], tt = type_ids ? type_ids[r] : 0;
    V o;
    if (id < 0 || id >= d.vocab || tt < 0 || tt >= d.type_vocab || t >= d.max_pos) {
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = from_f32<T>(NAN);
    } else {
      float w[W], p[W], y[W];
      load_as_floats<W>(w, word + id * d.hidden + q * W);
      load_as_floats<W>(p, pos + t * d.hidden + q * W);
      load_as_floats<W>(y, type + tt * d.hidden + q * W);
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = from_f32<T>(w[j] + p[j] + y[j]);
    }
    reinterpret_cast<V*>(e + r * d.hidden)[q] = o;
  }
}

// dword[ids[r], j] += de[r, j]: one thread per element, atomics (see the note at the top).
template <class T>
__global__ void word_backward_kernel(float* __restrict__ dword, const T* __restrict__ de,
                                     const int32_t* __restrict__ ids, EmbDims d) {
  const size_t n = static_cast<size_t>(d.batch * d.seq) * d.hidden;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = static_cast<int64_t>(i / d.hidden), j = static_cast<int64_t>(i % d.hidden);
    const int32_t id = ids[r];
    if (id >= 0 && id < d.vocab) atomicAdd(dword + id * d.hidden + j, to_f32(de[i]));
  }
}

// Block (x, y): columns j of block x, positions [y*chunk, (y+1)*chunk). For each position t the
// thread sums de[b, t, j] over b in order: dpos[t, j] += that sum (dpos may be nullptr), and
// token types v0 .. v0+nv-1 accumulate over the chunk into partials[y, k*H + j] (when given).
template <class T>
__global__ void pos_type_backward_kernel(float* __restrict__ dpos, float* __restrict__ partials,
                                         const T* __restrict__ de, const int32_t* __restrict__ type_ids,
                                         EmbDims d, int64_t chunk, int v0, int nv) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d.hidden) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t t1 = t0 + chunk < d.seq ? t0 + chunk : d.seq;
  float acc[kTypesPerPass] = {};
  for (int64_t t = t0; t < t1; ++t) {
    float ps = 0.0f;
    for (int64_t b = 0; b < d.batch; ++b) {
      const int64_t r = b * d.seq + t;
      const float x = to_f32(de[r * d.hidden + j]);
      ps += x;
      const int tt = type_ids ? type_ids[r] : 0;
#pragma unroll
      for (int k = 0; k < kTypesPerPass; ++k) acc[k] += (tt == v0 + k) ? x : 0.0f;
    }
    if (dpos) dpos[t * d.hidden + j] += ps;
  }
  if (partials)
    for (int k = 0; k < nv; ++k) partials[(static_cast<int64_t>(blockIdx.y) * nv + k) * d.hidden + j] = acc[k];
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                       const Tensor& pos, const Tensor& type, cudaStream_t s) {
  const EmbDims d{ids.dim(0), ids.dim(1), word.dim(1), word.dim(0), pos.dim(0), type.dim(0)};
  if (e.numel() == 0) return;
  const int32_t* tp = type_ids.defined() ? type_ids.ptr<const int32_t>() : nullptr;
  dispatch_float(e.dtype, "embedding_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVec<T>;
    const bool vec = d.hidden % W == 0 && aligned16(e.data) && aligned16(word.data) && aligned16(pos.data) &&
                     aligned16(type.data);
    auto launch = [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      const G *wp = word.ptr<const G>(), *pp = pos.ptr<const G>(), *yp = type.ptr<const G>();
      if (vec)
        embedding_forward_kernel<T, G, W><<<grid_for(e.numel() / W, kThreads), kThreads, 0, s>>>(
            e.ptr<T>(), ids.ptr<const int32_t>(), tp, wp, pp, yp, d);
      else
        embedding_forward_kernel<T, G, 1><<<grid_for(e.numel(), kThreads), kThreads, 0, s>>>(
            e.ptr<T>(), ids.ptr<const int32_t>(), tp, wp, pp, yp, d);
    };
    if (word.dtype == DType::F32)
      launch(TypeTag<float>{});
    else
      launch(TypeTag<T>{});
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                        const Tensor& ids, const Tensor& type_ids, const ReduceScratch& scratch, cudaStream_t s) {
  const int64_t hidden = de.dim(-1);
  const int64_t type_vocab = dtype.defined() ? dtype.dim(0) : 0;
  const EmbDims d{ids.dim(0), ids.dim(1), hidden, dword.defined() ? dword.dim(0) : 0, 0, type_vocab};
  if (de.numel() == 0) return;
  const int32_t* tp = type_ids.defined() ? type_ids.ptr<const int32_t>() : nullptr;
  dispatch_float(de.dtype, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dword.defined()) {
      word_backward_kernel<T><<<grid_for(de.numel(), kThreads), kThreads, 0, s>>>(dword.ptr<float>(), de.ptr<const T>(),
                                                                                 ids.ptr<const int32_t>(), d);
      ANATOMY_CUDA_LAUNCH_CHECK();
    }
    if (!dpos.defined() && !dtype.defined()) return;
    // Token types in passes of kTypesPerPass (BERT has 2: one pass); dpos goes with the first.
    const int passes = dtype.defined() ? static_cast<int>((type_vocab + kTypesPerPass - 1) / kTypesPerPass) : 1;
    const unsigned col_blocks = static_cast<unsigned>((hidden + kThreads - 1) / kThreads);
    for (int pass = 0; pass < std::max(passes, 1); ++pass) {
      const int v0 = pass * kTypesPerPass;
      const int nv = dtype.defined() ? static_cast<int>(std::min<int64_t>(kTypesPerPass, type_vocab - v0)) : 0;
      float* dp = pass == 0 && dpos.defined() ? dpos.ptr<float>() : nullptr;
      if (!dp && nv == 0) continue;
      int64_t chunks = d.seq;  // one position per block row: no type partial is larger than needed
      if (nv > 0) {
        const int64_t cap = static_cast<int64_t>(scratch.floats) / (nv * hidden);
        ANATOMY_CHECK(cap >= 1, "internal error: embedding_backward scratch of ", scratch.floats, " floats < ",
                      nv * hidden);
        chunks = std::min<int64_t>({chunks, cap, 65535});
      }
      const int64_t chunk = (d.seq + chunks - 1) / chunks;
      chunks = (d.seq + chunk - 1) / chunk;
      float* partials = nv > 0 ? scratch.data : nullptr;
      pos_type_backward_kernel<T><<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, s>>>(
          dp, partials, de.ptr<const T>(), tp, d, chunk, v0, nv);
      ANATOMY_CUDA_LAUNCH_CHECK();
      // partials [chunks, nv*H]: types (v0+k, v0+k+1) reduced two at a time.
      for (int k = 0; k < nv; k += 2) {
        float* out0 = dtype.ptr<float>() + (v0 + k) * hidden;
        float* out1 = k + 1 < nv ? out0 + hidden : nullptr;
        reduce_partials(out0, out1, nullptr, partials + k * hidden, static_cast<int>(chunks), hidden, nv * hidden, s);
      }
    }
  });
}

}  // namespace anatomy::cuda
