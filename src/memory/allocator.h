// The tagged allocator. Every byte the engine allocates goes through one of these, named by a
// Category, so the memory anatomy table is read off the allocator itself.
//
// Note [allocation policy]: buffers are allocated once per run (weights, gradients, optimizer
// state, the activation arena, the temporary arena, workspaces) and carved by offsets. Nothing
// is allocated inside a training step, so the per-category peaks equal the planned sizes.
#pragma once
#include <cstddef>
#include <mutex>
#include <string>

#include "core/tensor.h"
#include "memory/category.h"

namespace anatomy {

struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void sub(int64_t n) {
    current -= n;
    freed += n;
  }
};

struct AllocatorStats {
  Stat per_category[kNumCategories];
  Stat shared;  // bytes counted in two categories (CategoryBytes::shared)
  Stat total;
  CategoryBytes current() const;
  CategoryBytes peak() const;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;

  // Throws anatomy::Error on failure with the per-category table in the message.
  void* allocate(size_t bytes, Category c);
  void deallocate(void* p, size_t bytes, Category c) noexcept;
  // One block of `bytes` that holds a_bytes of category a and b_bytes of category b, which
  // overlap (a_bytes + b_bytes >= bytes): both categories count their full size, `shared`
  // the overlap, the total the block.
  void* allocate_shared(size_t bytes, Category a, size_t a_bytes, Category b, size_t b_bytes);
  void deallocate_shared(void* p, size_t bytes, Category a, size_t a_bytes, Category b, size_t b_bytes) noexcept;

  const AllocatorStats& stats() const { return m_stats; }
  // A table of current and peak MiB per category, one line each.
  std::string table() const;

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;  // returns nullptr when out of memory
  virtual void raw_deallocate(void* p) noexcept = 0;
  virtual std::string oom_hint(size_t bytes) const { return str_cat("could not allocate ", bytes, " bytes"); }

 private:
  void* raw_or_fail(size_t bytes, Category c);  // throws the out-of-memory report
  std::mutex m_mutex;
  AllocatorStats m_stats;
};

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::CPU; }
  // For tests: make allocations beyond this many bytes in total fail like an out-of-memory.
  void set_limit(int64_t bytes) { m_limit = bytes; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* p) noexcept override;

 private:
  int64_t m_limit = -1;
};

// A move-only owning buffer. Copying is deleted to prevent performance accidents.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& a, DType t, Shape s, Category c);
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;

  void reset() noexcept;
  const Tensor& tensor() const { return m_tensor; }
  operator const Tensor&() const { return m_tensor; }
  void* data() const { return m_tensor.data; }
  size_t bytes() const { return m_bytes; }
  Category category() const { return m_category; }

 private:
  Allocator* m_alloc = nullptr;
  Tensor m_tensor;
  size_t m_bytes = 0;
  Category m_category = Category::Other;
};

// A move-only block from Allocator::allocate_shared (the activations arena with the gradients
// inside it).
class SharedBlock {
 public:
  SharedBlock() = default;
  SharedBlock(Allocator& al, size_t bytes, Category a, size_t a_bytes, Category b, size_t b_bytes);
  ~SharedBlock() { reset(); }
  SharedBlock(const SharedBlock&) = delete;
  SharedBlock& operator=(const SharedBlock&) = delete;
  SharedBlock(SharedBlock&& o) noexcept { *this = std::move(o); }
  SharedBlock& operator=(SharedBlock&& o) noexcept;
  void reset() noexcept;
  char* data() const { return static_cast<char*>(m_data); }
  size_t bytes() const { return m_bytes; }
  Device device() const { return m_alloc ? m_alloc->device() : Device::CPU; }

 private:
  Allocator* m_alloc = nullptr;
  void* m_data = nullptr;
  size_t m_bytes = 0, m_a_bytes = 0, m_b_bytes = 0;
  Category m_a = Category::Other, m_b = Category::Other;
};

// A bump arena over one Buffer: carve tensors by offset, reset to reuse. Offsets are aligned
// to 256 bytes (cuBLASLt and vectorized kernels want at least 16).
//
// A dry arena (Arena::dry()) owns no memory: take() only counts, so the same carving code that
// lays out the real buffers also computes the plan's exact byte counts before allocation.
class Arena {
 public:
  Arena() = default;
  Arena(Allocator& a, size_t bytes, Category c) : m_buf(a, DType::U8, Shape{static_cast<int64_t>(bytes)}, c) {}
  // Over memory owned elsewhere (the first `bytes` of a SharedBlock).
  static Arena over(char* data, size_t bytes, Device d, Category c) {
    Arena a;
    a.m_ext = data;
    a.m_ext_bytes = bytes;
    a.m_ext_device = d;
    a.m_ext_category = c;
    return a;
  }
  static Arena dry() {
    Arena a;
    a.m_dry = true;
    return a;
  }
  bool is_dry() const { return m_dry; }
  Tensor take(DType t, Shape s);
  size_t used() const { return m_used; }
  size_t high_water() const { return m_high; }
  size_t capacity() const { return m_ext ? m_ext_bytes : m_buf.bytes(); }
  // The first byte of the memory (null when dry).
  char* base() const { return m_ext ? m_ext : static_cast<char*>(m_buf.data()); }
  void reset_to(size_t mark) { m_used = mark; }
  static size_t round_up(size_t n) { return (n + 255) & ~size_t{255}; }

 private:
  Buffer m_buf;
  char* m_ext = nullptr;  // Arena::over
  size_t m_ext_bytes = 0;
  Device m_ext_device = Device::CPU;
  Category m_ext_category = Category::Other;
  size_t m_used = 0, m_high = 0;
  bool m_dry = false;
};

}  // namespace anatomy
