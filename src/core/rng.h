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

// Uniform in [0, 1) with 24 bits of resolution.
ANATOMY_HD float uniform01(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ULL + mix64(offset + 0x632be59bd9b4e019ULL) + i);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// Dropout keeps element i when its uniform number is >= p; kept values are scaled by 1/(1-p).
ANATOMY_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, float p) {
  return uniform01(seed, offset, i) >= p;
}

// Host-side generator for initialization and shuffling (deterministic from a seed).
class Rng {
 public:
  explicit Rng(uint64_t seed) : m_state(seed) {}
  uint64_t next() { return mix64(m_state += 0x9e3779b97f4a7c15ULL); }
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
