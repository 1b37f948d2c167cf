// Comparing large buffers in tests: models, checkpoints, gradients, whole files.
//
// Never EXPECT_EQ two strings or vectors of megabytes: on failure GoogleTest builds a line diff of
// them (a lines x lines matrix for binary strings) and can eat the machine. These helpers report
// the size, the first differing index, how many differ and the largest difference, nothing more.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace anatomy::testing_compare {

// Element-wise equality (bitwise for floats: -0 != +0, NaN == NaN of the same bits) within an
// absolute tolerance `tol` (0: bit for bit).
template <class T>
::testing::AssertionResult same_values(std::span<const T> a, std::span<const T> b, double tol = 0) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size() << " elements";
  size_t count = 0, first = 0, worst = 0;
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bool same;
    double d = 0;
    if constexpr (std::is_floating_point_v<T>) {
      same = std::memcmp(&a[i], &b[i], sizeof(T)) == 0;
      if (!same) {
        d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
        if (std::isnan(d)) d = INFINITY;
        same = d <= tol;
      }
    } else {
      same = a[i] == b[i];
      d = same ? 0 : std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    }
    if (same) continue;
    if (count++ == 0) first = i;
    if (d > largest || count == 1) largest = d, worst = i;
  }
  if (count == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << count << " of " << a.size() << " elements differ"
                                       << (tol > 0 ? " by more than " + std::to_string(tol) : std::string())
                                       << "; first at " << first << " (" << +a[first] << " vs " << +b[first]
                                       << "); largest difference " << largest << " at " << worst;
}

template <class T>
::testing::AssertionResult same_values(const std::vector<T>& a, const std::vector<T>& b, double tol = 0) {
  return same_values(std::span<const T>(a), std::span<const T>(b), tol);
}

// The largest |x| of a buffer: the scale of a relative tolerance.
inline double largest_magnitude(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

inline std::vector<uint8_t> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Two files byte for byte.
inline ::testing::AssertionResult same_file_bytes(const std::filesystem::path& a, const std::filesystem::path& b) {
  if (!std::filesystem::exists(a)) return ::testing::AssertionFailure() << a << " does not exist";
  if (!std::filesystem::exists(b)) return ::testing::AssertionFailure() << b << " does not exist";
  auto r = same_values(file_bytes(a), file_bytes(b));
  if (!r) r << " (bytes of " << a << " vs " << b << ")";
  return r;
}

// Two safetensors files: the same tensor names, dtypes and shapes, and every tensor's values
// (read as F32) within `tol` (0: bit for bit); the failure names the first tensor that differs.
inline ::testing::AssertionResult same_safetensors(const std::filesystem::path& a, const std::filesystem::path& b,
                                                   double tol = 0) {
  const SafetensorsReader ra = SafetensorsReader::open(a.string()), rb = SafetensorsReader::open(b.string());
  std::vector<std::string> na, nb;
  for (const auto& t : ra.tensors()) na.push_back(t.name);
  for (const auto& t : rb.tensors()) nb.push_back(t.name);
  if (na != nb)
    return ::testing::AssertionFailure() << a << " and " << b << " hold different tensors (" << na.size() << " vs "
                                         << nb.size() << ")";
  size_t differing = 0;
  ::testing::AssertionResult first = ::testing::AssertionSuccess();
  for (const auto& t : ra.tensors()) {
    const auto& u = rb.info(t.name);
    if (t.dtype != u.dtype || t.shape != u.shape)
      return ::testing::AssertionFailure() << t.name << ": dtype or shape differs";
    std::vector<float> va(t.numel()), vb(u.numel());
    ra.read(t.name, DType::F32, va.data(), t.shape);
    rb.read(u.name, DType::F32, vb.data(), u.shape);
    auto r = same_values(va, vb, tol);
    if (!r && differing++ == 0) first = ::testing::AssertionFailure() << t.name << ": " << r.message();
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  return first << " (" << differing << " of " << na.size() << " tensors differ; " << a << " vs " << b << ")";
}

}  // namespace anatomy::testing_compare
