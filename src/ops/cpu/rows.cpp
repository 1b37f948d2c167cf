// Row gathers and scatters between padded and packed layouts (Note [packed inference] in
// model/bert.cpp): byte copies, so one implementation serves every element type.
#include <cstring>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

void gather_rows(void* out, const void* in, const int32_t* idx, int64_t n, size_t row_bytes) {
  auto* o = static_cast<char*>(out);
  const auto* x = static_cast<const char*>(in);
#pragma omp parallel for if (n * static_cast<int64_t>(row_bytes) > 4 * kParallelWork)
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * row_bytes, x + static_cast<size_t>(idx[i]) * row_bytes, row_bytes);
}

void scatter_rows(void* out, const void* in, const int32_t* idx, int64_t n, size_t row_bytes) {
  auto* o = static_cast<char*>(out);
  const auto* x = static_cast<const char*>(in);
#pragma omp parallel for if (n * static_cast<int64_t>(row_bytes) > 4 * kParallelWork)
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + static_cast<size_t>(idx[i]) * row_bytes, x + i * row_bytes, row_bytes);
}

}  // namespace anatomy::ref
