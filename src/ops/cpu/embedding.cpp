// BERT embeddings: word + position + token type. Shapes: ids, type_ids [B, T]; e, de [B*T, H];
// word [vocab, H], pos [max_pos, H], type [type_vocab, H].
#include "core/error.h"
#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

namespace {
// Ids come from user data: a bad one is reported with its position, not as a crash. (The
// sequence length against max_pos is the contract's, ops/contract.cpp.)
void check_ids(const int32_t* ids, const int32_t* type_ids, int64_t batch, int64_t seq,
               int64_t vocab, int64_t, int64_t type_vocab) {
  for (int64_t i = 0; i < batch * seq; ++i) {
    ANATOMY_CHECK(ids[i] >= 0 && ids[i] < vocab, "token id ", ids[i], " at [", i / seq, ", ",
                  i % seq, "] is out of range for vocab_size ", vocab);
    if (type_ids)
      ANATOMY_CHECK(type_ids[i] >= 0 && type_ids[i] < type_vocab, "token type id ", type_ids[i],
                    " at [", i / seq, ", ", i % seq, "] is out of range for type_vocab_size ",
                    type_vocab);
  }
}
}  // namespace

template <class T>
void embedding_forward(T* e, const int32_t* ids, const int32_t* type_ids, const T* word,
                       const T* pos, const T* type, int64_t batch, int64_t seq, int64_t hidden,
                       int64_t vocab, int64_t max_pos, int64_t type_vocab) {
  check_ids(ids, type_ids, batch, seq, vocab, max_pos, type_vocab);
#pragma omp parallel for if (batch * seq * hidden > kParallelWork)
  for (int64_t i = 0; i < batch * seq; ++i) {
    const T* w = word + static_cast<int64_t>(ids[i]) * hidden;
    const T* p = pos + (i % seq) * hidden;
    const T* ty = type + static_cast<int64_t>(type_ids ? type_ids[i] : 0) * hidden;
    T* out = e + i * hidden;
    for (int64_t j = 0; j < hidden; ++j) out[j] = w[j] + p[j] + ty[j];
  }
}

template <class T>
void embedding_backward(T* dword, T* dpos, T* dtype, const T* de, const int32_t* ids,
                        const int32_t* type_ids, int64_t batch, int64_t seq, int64_t hidden,
                        int64_t vocab, int64_t max_pos, int64_t type_vocab) {
  check_ids(ids, type_ids, batch, seq, vocab, max_pos, type_vocab);
  // Repeated ids scatter into the same rows, so threads split the hidden columns instead and
  // each walks the tokens in order: no races, and the same sums for any thread count.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (hidden + kBlock - 1) / kBlock;
#pragma omp parallel for if (batch * seq * hidden > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < hidden ? j0 + kBlock : hidden;
    for (int64_t i = 0; i < batch * seq; ++i) {
      const T* g = de + i * hidden;
      T* w = dword ? dword + static_cast<int64_t>(ids[i]) * hidden : nullptr;
      T* p = dpos ? dpos + (i % seq) * hidden : nullptr;
      T* ty = dtype ? dtype + static_cast<int64_t>(type_ids ? type_ids[i] : 0) * hidden : nullptr;
      for (int64_t j = j0; j < j1; ++j) {
        if (w) w[j] += g[j];
        if (p) p[j] += g[j];
        if (ty) ty[j] += g[j];
      }
    }
  }
}

#define ANATOMY_INSTANTIATE(T)                                                               \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const T*, const T*, \
                                     const T*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                                     int64_t);                                               \
  template void embedding_backward<T>(T*, T*, T*, const T*, const int32_t*, const int32_t*,  \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
