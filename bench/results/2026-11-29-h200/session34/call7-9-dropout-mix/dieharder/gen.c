// Streams 64-bit outputs of a mixer over x_n = key + (n * stride) * G to stdout (raw).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static const uint64_t G = 0x9e3779b97f4a7c15ULL;
static inline uint64_t splitmix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline uint64_t fold32(uint64_t z) {  // x ^= x >> 32, mul, fold, mul, fold
  z ^= z >> 32;
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 32;
  z *= 0x94d049bb133111ebULL;
  return z ^ (z >> 32);
}
static inline uint64_t fold32b(uint64_t z) {  // without the first fold
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 32;
  z *= 0x94d049bb133111ebULL;
  return z ^ (z >> 32);
}
int main(int argc, char** argv) {
  const char* which = argv[1];
  uint64_t stride = argc > 2 ? strtoull(argv[2], 0, 0) : 1;
  uint64_t key = argc > 3 ? strtoull(argv[3], 0, 0) : 0x1234567887654321ULL;
  uint64_t buf[4096];
  for (uint64_t n = 0;;) {
    for (int i = 0; i < 4096; ++i, ++n) {
      uint64_t x = key + n * stride * G;
      buf[i] = !strcmp(which, "splitmix") ? splitmix(x) : !strcmp(which, "fold32") ? fold32(x) : fold32b(x);
    }
    if (fwrite(buf, 8, 4096, stdout) != 4096) return 0;
  }
}
