// Does cuBLASLt's first heuristic pick leave speed behind on bert-large's GEMMs?
//
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/gemm_algos.cu -lcublasLt -o /tmp/gemm_algos && /tmp/gemm_algos [tokens]
//
// For each GEMM of a bert-large layer (tokens = batch x seq rows, default 32 x 512), in the
// layouts and types the training step uses (src/model/bert.cpp): forward y = x W^T + b (bf16, the
// bias epilogue), data gradient dx = dy W (bf16), weight gradient dW += dy^T x (bf16 inputs, fp32
// accumulated in place). It asks the heuristic for up to 16 algorithms with the product's 32 MiB
// workspace, times each (CUDA events, 5 warm-up launches, median of 7 runs of 10 launches) and
// prints the first pick's time against the fastest's. Prints one markdown table.
//
// With --sustained (after the token count) it asks instead which pick costs the least energy: the
// bf16 step runs at the board's power limit (README, "How far from 2x"), where a GEMM's time in the
// step follows its energy a call, not its time at the full clock. The operands are then random
// (bit toggles draw power; constant operands draw less), and each of the first 6 candidates runs
// alone for 0.4 s (the clock settles at the limit) and then 0.6 s measured: calls a second, NVML's
// energy counter (mJ a call), the mean SM clock and power; two rounds, the candidates alternated.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    auto e_ = (x);                                                                     \
    if (static_cast<int>(e_) != 0) {                                                   \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e_); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Gemm {
  const char* name;
  long m, n, k;    // ours: C [M, N] = op(A) op(B), row-major
  bool ta, tb;     // A is [K, M] when ta, B is [N, K] when tb
  bool f32_out;    // C/D in fp32 (the weight gradients)
  float beta;
  bool bias;
};

static float time_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t* algo,
                       const void* a, const void* b, void* c, float beta, void* ws, size_t ws_bytes,
                       cudaStream_t s) {
  const float alpha = 1.0f;
  auto launch = [&] {
    return cublasLtMatmul(h, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, algo, ws, ws_bytes, s);
  };
  for (int i = 0; i < 5; ++i)
    if (launch() != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> runs;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 10; ++i) launch();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    runs.push_back(ms / 10);
  }
  std::sort(runs.begin(), runs.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return runs[3];
}

// NVML through dlopen (the ABI of nvml.h's v2 entry points), for --sustained.
struct Nvml {
  using Dev = void*;
  int (*energy)(Dev, unsigned long long*) = nullptr;  // mJ since the driver loaded
  int (*clock)(Dev, int, unsigned*) = nullptr;        // type 1: SM, MHz
  int (*power)(Dev, unsigned*) = nullptr;             // mW
  Dev dev = nullptr;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<int (*)(unsigned, Dev*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<decltype(energy)>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    clock = reinterpret_cast<decltype(clock)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<decltype(power)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    if (!init || !handle || init() != 0 || handle(0, &dev) != 0) dev = nullptr;
  }
};

struct Sustained {
  double ms, mj, mhz, watts;
};

// Launches in groups of 20 until `seconds` have passed; the measured window's calls, energy, and
// the SM clock and power sampled after each group.
template <class Launch>
static Sustained run_sustained(Launch launch, cudaStream_t s, const Nvml& nv, double warm_s, double seconds) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto run = [&](double secs, Sustained* out) {
    unsigned long long mj0 = 0, mj1 = 0;
    if (out) nv.energy(nv.dev, &mj0);
    CK(cudaEventRecord(e0, s));
    long calls = 0;
    double mhz = 0, watts = 0;
    int samples = 0;
    float ms = 0;
    while (ms < secs * 1e3) {
      for (int i = 0; i < 20; ++i) launch();
      calls += 20;
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms, e0, e1));
      unsigned c = 0, mw = 0;
      if (nv.clock(nv.dev, 1, &c) == 0 && nv.power(nv.dev, &mw) == 0) {
        mhz += c;
        watts += mw / 1e3;
        ++samples;
      }
    }
    if (out) {
      nv.energy(nv.dev, &mj1);
      *out = {ms / calls, static_cast<double>(mj1 - mj0) / calls, mhz / std::max(samples, 1),
              watts / std::max(samples, 1)};
    }
  };
  Sustained r{};
  run(warm_s, nullptr);
  run(seconds, &r);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return r;
}

// Uniform bf16 in [-1, 1) from a hash of the index.
__global__ void fill_random(unsigned short* x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    unsigned long long z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float f = static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    unsigned bits;
    std::memcpy(&bits, &f, 4);
    x[i] = static_cast<unsigned short>(bits >> 16);
  }
}

int main(int argc, char** argv) {
  const long T = argc > 1 ? std::atol(argv[1]) : 32 * 512, H = 1024, I = 4096;
  const bool sustained = argc > 2 && std::strcmp(argv[2], "--sustained") == 0;
  const Nvml nv;
  if (sustained && (!nv.dev || !nv.energy || !nv.clock || !nv.power)) {
    std::fprintf(stderr, "gemm_algos: --sustained needs NVML (libnvidia-ml.so.1) with the energy counter\n");
    return 1;
  }
  const Gemm gemms[] = {
      {"qkv forward", T, 3 * H, H, false, true, false, 0, true},
      {"attention out forward", T, H, H, false, true, false, 0, true},
      {"ffn in forward", T, I, H, false, true, false, 0, true},
      {"ffn out forward", T, H, I, false, true, false, 0, true},
      {"qkv data grad", T, H, 3 * H, false, false, false, 1, false},
      {"attention out data grad", T, H, H, false, false, false, 0, false},
      {"ffn in data grad", T, H, I, false, false, false, 1, false},
      {"ffn out data grad", T, I, H, false, false, false, 0, false},
      {"qkv weight grad", 3 * H, H, T, true, false, true, 1, false},
      {"attention out weight grad", H, H, T, true, false, true, 1, false},
      {"ffn in weight grad", I, H, T, true, false, true, 1, false},
      {"ffn out weight grad", H, I, T, true, false, true, 1, false},
  };
  cublasLtHandle_t h;
  CK(cublasLtCreate(&h));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const size_t ws_bytes = 32u << 20;
  void *ws, *a, *b, *c, *bias;
  const size_t big = static_cast<size_t>(T) * I;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMalloc(&a, big * 2));
  CK(cudaMalloc(&b, big * 2));
  CK(cudaMalloc(&c, big * 4));
  CK(cudaMalloc(&bias, I * 2));
  if (sustained) {
    fill_random<<<1024, 256>>>(static_cast<unsigned short*>(a), big, 1);
    fill_random<<<1024, 256>>>(static_cast<unsigned short*>(b), big, 2);
  } else {
    CK(cudaMemset(a, 0x3c, big * 2));  // bf16 ~0.01: finite products
    CK(cudaMemset(b, 0x3c, big * 2));
  }
  CK(cudaMemset(c, 0, big * 4));
  CK(cudaMemset(bias, 0, I * 2));
  if (sustained) {
    std::printf("| GEMM (tokens %ld) | # | round | ms a call | mJ a call | MHz | W | TFLOP/s | mJ / first's |\n", T);
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  } else {
    std::printf("| GEMM (tokens %ld) | M x N x K | candidates | first pick ms | fastest ms | fastest is # | first / fastest | first TFLOP/s | fastest TFLOP/s |\n",
                T);
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  double first_sum = 0, best_sum = 0;
  for (const Gemm& g : gemms) {
    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLASLt's A is our B, its B our A (C^T = op(B)^T op(A)^T in column-major terms).
    const cublasOperation_t opa = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (g.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bt = CUDA_R_16BF;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    if (g.tb)
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, g.k, g.n, g.k));
    else
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, g.n, g.k, g.n));
    if (g.ta)
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, g.m, g.k, g.m));
    else
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, g.k, g.m, g.k));
    CK(cublasLtMatrixLayoutCreate(&lc, g.f32_out ? CUDA_R_32F : CUDA_R_16BF, g.n, g.m, g.n));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t res[16];
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 16, res, &found));
    const double flop = 2.0 * g.m * g.n * g.k;
    if (sustained) {
      const float alpha = 1.0f;
      for (int round = 1; round <= 2; ++round) {
        double first_mj = 0;
        for (int i = 0; i < std::min(found, 6); ++i) {
          if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
          const cublasLtMatmulAlgo_t* algo = &res[i].algo;
          const Sustained r = run_sustained(
              [&] { cublasLtMatmul(h, desc, &alpha, b, la, a, lb, &g.beta, c, lc, c, lc, algo, ws, ws_bytes, s); }, s,
              nv, 0.4, 0.6);
          if (i == 0) first_mj = r.mj;
          std::printf("| %s | %d | %d | %.4f | %.2f | %.0f | %.0f | %.0f | %.3f |\n", g.name, i, round, r.ms, r.mj, r.mhz,
                      r.watts, flop / r.ms / 1e9, r.mj / first_mj);
          std::fflush(stdout);
        }
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
      continue;
    }
    float first = -1, best = 1e30f;
    int best_i = -1;
    for (int i = 0; i < found; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
      const float ms = time_algo(h, desc, la, lb, lc, &res[i].algo, a, b, c, g.beta, ws, ws_bytes, s);
      if (i == 0) first = ms;
      if (ms > 0 && ms < best) {
        best = ms;
        best_i = i;
      }
    }
    first_sum += first;
    best_sum += best;
    std::printf("| %s | %ld x %ld x %ld | %d | %.4f | %.4f | %d | %.3f | %.0f | %.0f |\n", g.name, g.m, g.n, g.k, found,
                first, best, best_i, first / best, flop / first / 1e9, flop / best / 1e9);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  if (sustained) return 0;
  std::printf("\nA layer's twelve GEMMs: first picks %.3f ms, fastest %.3f ms (%.1f%% less); x24 layers: %.2f ms a step.\n",
              first_sum, best_sum, 100.0 * (1 - best_sum / first_sum), 24 * (first_sum - best_sum));
  return 0;
}
