// Dtype conversions on host tensors, used by CpuBackend's cast and fill.
#pragma once
#include "core/tensor.h"

namespace anatomy::cpu {

// dst = src element by element: between F32, BF16, F16 and F64 (round to nearest even), or
// I32 to I32. Other pairs throw anatomy::Error.
void cast(const Tensor& dst, const Tensor& src);
// Every element of dst = value (F32, BF16, F16, F64; I32 takes the value truncated).
void fill(const Tensor& dst, float value);

}  // namespace anatomy::cpu
