#include "ops/cpu/convert.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu/scalar.h"

namespace anatomy::cpu {

namespace {

bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64;
}

double load(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F64:
      return static_cast<const double*>(p)[i];
    default:
      return 0.0;  // unreachable: callers check is_float
  }
}

void store(DType t, void* p, int64_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case DType::F64:
      static_cast<double*>(p)[i] = v;
      break;
    default:
      break;
  }
}

}  // namespace

// Sizes and dtypes as the contract checked them (ops/contract.cpp).
void cast(const Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype) {
    std::memcpy(dst.data, src.data, src.bytes());
    return;
  }
  const int64_t n = static_cast<int64_t>(src.numel());
#pragma omp parallel for if (n > ref::kParallelWork)
  for (int64_t i = 0; i < n; ++i) store(dst.dtype, dst.data, i, load(src.dtype, src.data, i));
}

void fill(const Tensor& dst, float value) {
  const int64_t n = static_cast<int64_t>(dst.numel());
  if (dst.dtype == DType::I32) {
    const int32_t v = static_cast<int32_t>(value);
    int32_t* p = dst.ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = v;
    return;
  }
  ANATOMY_CHECK(is_float(dst.dtype), "fill: ", dtype_name(dst.dtype), " is not supported");
#pragma omp parallel for if (n > ref::kParallelWork)
  for (int64_t i = 0; i < n; ++i) store(dst.dtype, dst.data, i, value);
}

}  // namespace anatomy::cpu
