#include "memory/allocator.h"

#include <cstdio>
#include <cstdlib>

namespace anatomy {

CategoryBytes AllocatorStats::current() const {
  CategoryBytes b;
  for (int i = 0; i < kNumCategories; ++i) b.v[i] = per_category[i].current;
  b.shared = shared.current;
  return b;
}
CategoryBytes AllocatorStats::peak() const {
  CategoryBytes b;
  for (int i = 0; i < kNumCategories; ++i) b.v[i] = per_category[i].peak;
  b.shared = shared.peak;
  return b;
}

void* Allocator::allocate(size_t bytes, Category c) {
  if (bytes == 0) bytes = 1;
  void* p = raw_or_fail(bytes, c);
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stats.per_category[static_cast<int>(c)].add(static_cast<int64_t>(bytes));
  m_stats.total.add(static_cast<int64_t>(bytes));
  return p;
}

void* Allocator::raw_or_fail(size_t bytes, Category c) {
  void* p = raw_allocate(bytes);
  if (!p) {
    std::lock_guard<std::mutex> lock(m_mutex);
    fail("out of memory on ", device_name(device()), " while allocating ", bytes / (1024.0 * 1024.0),
         " MiB for ", category_name(c), ": ", oom_hint(bytes), "; allocated so far: ", table(),
         " -- try a smaller --per-device-train-batch-size with --gradient-accumulation-steps, "
         "--gradient-checkpointing layer, or --optim adamw-8bit");
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, Category c) noexcept {
  if (!p) return;
  if (bytes == 0) bytes = 1;
  raw_deallocate(p);
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stats.per_category[static_cast<int>(c)].sub(static_cast<int64_t>(bytes));
  m_stats.total.sub(static_cast<int64_t>(bytes));
}

void* Allocator::allocate_shared(size_t bytes, Category a, size_t a_bytes, Category b, size_t b_bytes) {
  ANATOMY_CHECK(bytes > 0 && a_bytes <= bytes && b_bytes <= bytes && a_bytes + b_bytes >= bytes,
                "internal error: shared block of ", bytes, " bytes for ", a_bytes, " + ", b_bytes);
  void* p = raw_or_fail(bytes, a);
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stats.per_category[static_cast<int>(a)].add(static_cast<int64_t>(a_bytes));
  m_stats.per_category[static_cast<int>(b)].add(static_cast<int64_t>(b_bytes));
  m_stats.shared.add(static_cast<int64_t>(a_bytes + b_bytes - bytes));
  m_stats.total.add(static_cast<int64_t>(bytes));
  return p;
}

void Allocator::deallocate_shared(void* p, size_t bytes, Category a, size_t a_bytes, Category b,
                                  size_t b_bytes) noexcept {
  if (!p) return;
  raw_deallocate(p);
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stats.per_category[static_cast<int>(a)].sub(static_cast<int64_t>(a_bytes));
  m_stats.per_category[static_cast<int>(b)].sub(static_cast<int64_t>(b_bytes));
  m_stats.shared.sub(static_cast<int64_t>(a_bytes + b_bytes - bytes));
  m_stats.total.sub(static_cast<int64_t>(bytes));
}

std::string Allocator::table() const {
  std::string s;
  char line[160];
  for (int i = 0; i < kNumCategories; ++i) {
    const Stat& st = m_stats.per_category[i];
    std::snprintf(line, sizeof line, "%s%s %.1f MiB (peak %.1f)", i ? ", " : "",
                  std::string(category_name(static_cast<Category>(i))).c_str(), st.current / 1048576.0,
                  st.peak / 1048576.0);
    s += line;
  }
  if (m_stats.shared.peak > 0) {
    std::snprintf(line, sizeof line, ", of which %s %.1f MiB (peak %.1f) counted twice",
                  std::string(kSharedName).c_str(), m_stats.shared.current / 1048576.0, m_stats.shared.peak / 1048576.0);
    s += line;
  }
  return s;
}

void* CpuAllocator::raw_allocate(size_t bytes) {
  if (m_limit >= 0 && stats().total.current + static_cast<int64_t>(bytes) > m_limit) return nullptr;
  return std::aligned_alloc(256, (bytes + 255) & ~size_t{255});
}
void CpuAllocator::raw_deallocate(void* p) noexcept { std::free(p); }

Buffer::Buffer(Allocator& a, DType t, Shape s, Category c)
    : m_alloc(&a), m_bytes(s.numel() * dtype_size(t)), m_category(c) {
  m_tensor = Tensor(a.allocate(m_bytes, c), t, s, a.device());
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    m_alloc = o.m_alloc;
    m_tensor = o.m_tensor;
    m_bytes = o.m_bytes;
    m_category = o.m_category;
    o.m_alloc = nullptr;
    o.m_tensor = Tensor();
    o.m_bytes = 0;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (m_alloc && m_tensor.data) m_alloc->deallocate(m_tensor.data, m_bytes, m_category);
  m_alloc = nullptr;
  m_tensor = Tensor();
  m_bytes = 0;
}

SharedBlock::SharedBlock(Allocator& al, size_t bytes, Category a, size_t a_bytes, Category b, size_t b_bytes)
    : m_alloc(&al), m_bytes(bytes), m_a_bytes(a_bytes), m_b_bytes(b_bytes), m_a(a), m_b(b) {
  m_data = al.allocate_shared(bytes, a, a_bytes, b, b_bytes);
}

SharedBlock& SharedBlock::operator=(SharedBlock&& o) noexcept {
  if (this != &o) {
    reset();
    m_alloc = o.m_alloc;
    m_data = o.m_data;
    m_bytes = o.m_bytes;
    m_a_bytes = o.m_a_bytes;
    m_b_bytes = o.m_b_bytes;
    m_a = o.m_a;
    m_b = o.m_b;
    o.m_alloc = nullptr;
    o.m_data = nullptr;
  }
  return *this;
}

void SharedBlock::reset() noexcept {
  if (m_alloc && m_data) m_alloc->deallocate_shared(m_data, m_bytes, m_a, m_a_bytes, m_b, m_b_bytes);
  m_alloc = nullptr;
  m_data = nullptr;
}

Tensor Arena::take(DType t, Shape s) {
  size_t n = round_up(s.numel() * dtype_size(t));
  if (m_dry) {
    Tensor out(reinterpret_cast<void*>(m_used + 256), t, s, Device::CPU);  // never dereferenced
    m_used += n;
    if (m_used > m_high) m_high = m_used;
    return out;
  }
  ANATOMY_CHECK(m_used + n <= capacity(), "internal error: arena of ", capacity(), " bytes for ",
                category_name(m_ext ? m_ext_category : m_buf.category()), " overflows (", m_used, " used, ", n,
                " more asked)");
  char* base = m_ext ? m_ext : static_cast<char*>(m_buf.data());
  Tensor out(base + m_used, t, s, m_ext ? m_ext_device : m_buf.tensor().device);
  m_used += n;
  if (m_used > m_high) m_high = m_used;
  return out;
}

}  // namespace anatomy
