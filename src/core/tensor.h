// A non-owning, contiguous, row-major view of device or host memory.
// Ownership lives in memory/allocator.h (Buffer); every owning buffer carries a memory Category.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace anatomy {

enum class Device : uint8_t { CPU, CUDA };

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// Up to 4 dimensions are enough for every tensor in an encoder (B, heads, T, head_dim).
struct Shape {
  std::array<int64_t, 4> d{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    ANATOMY_ASSERT(dims.size() <= 4);
    for (int64_t v : dims) d[rank++] = v;
  }
  int64_t operator[](int i) const { return d[i]; }
  size_t numel() const {
    size_t n = 1;
    for (int i = 0; i < rank; ++i) n *= static_cast<size_t>(d[i]);
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  Tensor() = default;
  Tensor(void* p, DType t, Shape s, Device dev) : data(p), dtype(t), shape(s), device(dev) {}

  bool defined() const { return data != nullptr; }
  size_t numel() const { return shape.numel(); }
  size_t bytes() const { return numel() * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.rank + i : i]; }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }

  // Same memory seen with another shape of equal element count.
  Tensor view(Shape s) const {
    ANATOMY_CHECK(s.numel() == numel(), "internal error: view ", s.str(), " of ", shape.str());
    return Tensor(data, dtype, s, device);
  }
  // Rows [begin, end) of the leading dimension.
  Tensor slice(int64_t begin, int64_t end) const {
    ANATOMY_ASSERT(shape.rank >= 1 && 0 <= begin && begin <= end && end <= shape[0]);
    Shape s = shape;
    s.d[0] = end - begin;
    size_t row = shape[0] ? numel() / shape[0] : 0;
    return Tensor(static_cast<char*>(data) + begin * row * dtype_size(dtype), dtype, s, device);
  }
};

}  // namespace anatomy
