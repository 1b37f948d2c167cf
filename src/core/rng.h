// Counter-based random numbers: the value for element i of stream (seed, offset) is a pure
// function, identical on the CPU and the GPU. Dropout masks are regenerated in backward
// instead of stored, and the CPU twin reproduces the GPU mask bit for bit.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define ANATOMY_HD __host__ __device__ __forceinline__
#else
#define ANATOMY_HD inline
#endif

namespace anatomy {

// splitmix64 finalizer: a bijective mix with good avalanche.
ANATOMY_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Note [dropout bits]
// One 64-bit hash decides four elements: element i of a dropout stream belongs to group i / 4
// and reads the 16-bit field i % 4 (bits 16*(i%4) .. +16) of
//   bits(group) = dropout_mix(key + group * kGolden),   key = dropout_key(seed, offset),
// and is kept iff field >= thr = ceil(p * 2^16) (p quantized up to a multiple of 2^-16; p >= 1
// keeps nothing). bits(0), bits(1), ... is splitmix64's Weyl sequence of states from `key`, each
// through dropout_mix (Note [dropout mix]) instead of splitmix64's own output mix, so the fields
// are as good as independent uniform 16-bit numbers as far as dieharder tells.
// The hash (two 64-bit multiplies, the costly part on a GPU) is paid once per four elements:
// kernels whose threads own aligned groups of four (16-byte packs, the attention fragments)
// hash once per group; any other element evaluates its own group and takes its field, with
// the same answer. Kept values are scaled by 1 / (1 - p) (the nominal p).
//
// Attention probabilities use the same function on their own element index (Note [attention
// dropout index]): groups are 2x2 blocks (two queries x two keys), which is what one thread of
// the flash kernels holds in both the forward and the backward.
inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// The per-call key of stream (seed, offset): distinct offsets of one seed get distinct keys.
ANATOMY_HD uint64_t dropout_key(uint64_t seed, uint64_t offset) {
  return mix64(seed ^ mix64(offset + 0x632be59bd9b4e019ULL));
}
// The 16-bit threshold of probability p: 0 for p <= 0 (keep all), 65536 for p >= 1 (keep none).
ANATOMY_HD uint32_t dropout_threshold(float p) {
  if (!(p > 0.0f)) return 0;
  if (p >= 1.0f) return 65536u;
  const float t = p * 65536.0f;  // exact (a power-of-two scale)
  const uint32_t f = static_cast<uint32_t>(t);
  return static_cast<float>(f) < t ? f + 1 : f;  // ceil
}
// Note [dropout mix]
// The group's 64 bits come from a cheaper bijective mix than mix64: two multiplies, as splitmix64's
// finalizer, but every xorshift by 32, which on a GPU of 32-bit registers is one xor of the high
// word into the low (the splitmix64 shifts by 30, 27 and 31 each take two funnel shifts and two
// xors): ~9 instructions a group instead of ~20. Over the dropout counters (splitmix64's Weyl
// sequence of states, consecutive and at the attention kernels' stride 1024) no test of dieharder
// -a failed on it, and the few WEAK ones passed when rerun with more samples; splitmix64's own mix
// drew as many WEAK (bench/results/2026-11-29-h200/session34/call7-9-dropout-mix/dieharder/). The
// hash was 20% of the attention forward's time at p 0.1 and 5% of its backward's; with this mix
// the attention took 0.522 -> 0.500 ms at bert-large's shape and the step 68.47 -> 67.77 ms
// (session34/call6-hash-ceiling-not-kept/, call7-9-dropout-mix/).
ANATOMY_HD uint64_t dropout_mix(uint64_t z) {
  z ^= z >> 32;
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 32;
  z *= 0x94d049bb133111ebULL;
  return z ^ (z >> 32);
}
// The 64 random bits of a group (four 16-bit fields).
ANATOMY_HD uint64_t dropout_group_bits(uint64_t key, uint64_t group) { return dropout_mix(key + group * kGolden); }
// Field f (0..3) of a group's bits kept under threshold thr.
ANATOMY_HD bool dropout_field_keep(uint64_t bits, int f, uint32_t thr) {
  return static_cast<uint32_t>((bits >> (16 * f)) & 0xffffu) >= thr;
}
ANATOMY_HD bool dropout_keep_key(uint64_t key, uint64_t i, uint32_t thr) {
  return dropout_field_keep(dropout_group_bits(key, i >> 2), static_cast<int>(i & 3), thr);
}
// Dropout keeps element i of stream (seed, offset) with probability about 1 - p.
ANATOMY_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, float p) {
  return dropout_keep_key(dropout_key(seed, offset), i, dropout_threshold(p));
}
// keep[j] = dropout_keep_key(key, i + j, thr) for j < W: one hash per group when the run is
// made of whole groups (W % 4 == 0 and i % 4 == 0, as 16-byte packs are), else one per element.
template <int W>
ANATOMY_HD void dropout_keep_run(bool (&keep)[W], uint64_t key, uint64_t i, uint32_t thr) {
  if constexpr (W % 4 == 0) {
    if ((i & 3) == 0) {
      for (int g = 0; g < W / 4; ++g) {
        const uint64_t bits = dropout_group_bits(key, (i >> 2) + static_cast<uint64_t>(g));
        for (int f = 0; f < 4; ++f) keep[4 * g + f] = dropout_field_keep(bits, f, thr);
      }
      return;
    }
  }
  for (int j = 0; j < W; ++j) keep[j] = dropout_keep_key(key, i + static_cast<uint64_t>(j), thr);
}

// Note [attention dropout index]
// The probability of query q and key k of head h of sample b (T tokens, Tp = ceil(T / 2) pairs)
// is element
//   index = ((((b*heads + h)*Tp + q/2)*Tp + k/2) << 2) | (q%2)*2 | (k%2)
// of its dropout stream: each group of four is the 2x2 block of queries {q, q+1} x keys
// {k, k+1} (q, k even), field (q%2)*2 + (k%2).
ANATOMY_HD uint64_t attention_dropout_index(uint64_t bh, uint64_t q, uint64_t k, uint64_t T) {
  const uint64_t tp = (T + 1) >> 1;
  return (((bh * tp + (q >> 1)) * tp + (k >> 1)) << 2) | ((q & 1) << 1) | (k & 1);
}

// Host-side generator for initialization and shuffling (deterministic from a seed).
class Rng {
 public:
  explicit Rng(uint64_t seed) : m_state(seed) {}
  uint64_t next() { return mix64(m_state += kGolden); }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Standard normal via Box-Muller (one value per call; simple over fast).
  double normal();
  // Uniform integer in [lo, hi).
  int64_t randint(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo)); }
  uint64_t state() const { return m_state; }
  void set_state(uint64_t s) { m_state = s; }

 private:
  uint64_t m_state;
};

}  // namespace anatomy
