// Helpers shared by the CPU op tests: fresh random inputs, host tensors over std::vector,
// poisoning, comparisons and a central-difference gradient check.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/backend.h"

#include "core/rng.h"
#include "core/tensor.h"

namespace anatomy::test {

// A fresh seed per test (ANATOMY_TEST_SEED reproduces a failure); the seed is in the trace.
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("ANATOMY_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}
#define ANATOMY_FRESH_RNG(rng)                                     \
  const uint64_t rng##_seed = ::anatomy::test::fresh_seed();       \
  SCOPED_TRACE("ANATOMY_TEST_SEED=" + std::to_string(rng##_seed)); \
  ::anatomy::Rng rng(rng##_seed)

template <class T = double>
std::vector<T> randn(Rng& r, size_t n, double scale = 1.0) {
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(r.normal() * scale);
  return v;
}
inline std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }
inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline Tensor host(std::vector<float>& v, Shape s) {
  EXPECT_EQ(v.size(), s.numel());
  return Tensor(v.data(), DType::F32, s, Device::CPU);
}
inline Tensor host(std::vector<int32_t>& v, Shape s) {
  EXPECT_EQ(v.size(), s.numel());
  return Tensor(v.data(), DType::I32, s, Device::CPU);
}
// An output buffer full of NaN, so an element the op forgets to write shows up.
inline std::vector<float> poisoned(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Every element written and finite, and max |got - want| <= rtol * max(1e-3, max |want|).
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-3, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i]))
        << what << ": element " << i << " not written (" << got[i] << ")";
    scale = std::max(scale, std::abs(want[i]));
    if (std::abs(got[i] - want[i]) > err) err = std::abs(got[i] - want[i]), worst = i;
  }
  EXPECT_LE(err, rtol * scale) << what << ": worst element " << worst << " got " << got[worst]
                               << " want " << want[worst];
}

// Central differences of loss() with respect to every element of x against the analytic
// gradient: max |numeric - analytic| <= tol * max(1, max |gradient|).
inline void expect_grad(std::vector<double>& x, const std::vector<double>& analytic,
                        const std::function<double()>& loss, const std::string& what,
                        double h = 1e-5, double tol = 1e-7) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double err = 0, scale = 1;
  size_t worst = 0;
  double worst_num = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double num = (up - down) / (2 * h);
    scale = std::max({scale, std::abs(num), std::abs(analytic[i])});
    if (std::abs(num - analytic[i]) >= err)
      err = std::abs(num - analytic[i]), worst = i, worst_num = num;
  }
  EXPECT_LE(err, tol * scale) << what << ": worst element " << worst << " numeric " << worst_num
                              << " analytic " << analytic[worst];
}

// norm_sq[0] = sum of x^2 through the backend's two gradient-norm ops (Note [canonical gradient
// norm] in optim/grad_norm.h).
inline void norm_sq_of(Backend& be, std::vector<float>& norm_sq, std::vector<float>& x) {
  std::vector<float> partials((x.size() + kNormBlock - 1) / kNormBlock);
  const int64_t blocks = static_cast<int64_t>(partials.size());
  be.block_sum_squares(host(partials, {blocks}), host(x, {static_cast<int64_t>(x.size())}));
  be.sum_blocks(host(norm_sq, {1}), host(partials, {blocks}));
}

}  // namespace anatomy::test
