// Scratch: host cost of op calls through the contract on the CPU backend, tiny tensors.
#include <chrono>
#include <cstdio>
#include "ops/backend.h"
#include "memory/allocator.h"
using namespace anatomy;
int main() {
  auto be = make_cpu_backend(1);
  Buffer a(be->allocator(), DType::F32, {4, 4}, Category::Other), b(be->allocator(), DType::F32, {4, 4}, Category::Other),
      c(be->allocator(), DType::F32, {4, 4}, Category::Other);
  be->fill(a.tensor(), 1.0f); be->fill(b.tensor(), 1.0f);
  for (int rep = 0; rep < 3; ++rep) {
    const int n = 200000;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) be->matmul(c.tensor(), a.tensor(), Trans::N, b.tensor(), Trans::N, MatmulArgs{});
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) be->copy(c.tensor(), a.tensor());
    auto t2 = std::chrono::steady_clock::now();
    std::printf("matmul 4x4: %.3f us/call; copy: %.3f us/call\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count() / n,
                std::chrono::duration<double, std::micro>(t2 - t1).count() / n);
  }
}
