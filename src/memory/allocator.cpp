#include "memory/allocator.h"

#include <cstdio>
#include <cstdlib>

namespace anatomy {

CategoryBytes AllocatorStats::current() const {
  CategoryBytes b;
  for (int i = 0; i < kNumCategories; ++i) b.v[i] = per_category[i].current;
  return b;
}
CategoryBytes AllocatorStats::peak() const {
  CategoryBytes b;
  for (int i = 0; i < kNumCategories; ++i) b.v[i] = per_category[i].peak;
  return b;
}

void* Allocator::allocate(size_t bytes, Category c) {
  if (bytes == 0) bytes = 1;
  void* p = raw_allocate(bytes);
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!p)
    fail("out of memory on ", device_name(device()), " while allocating ", bytes / (1024.0 * 1024.0),
         " MiB for ", category_name(c), ": ", oom_hint(bytes), "; allocated so far: ", table(),
         " -- try a smaller --per-device-train-batch-size with --gradient-accumulation-steps, "
         "--gradient-checkpointing layer, or --optim adamw-8bit");
  m_stats.per_category[static_cast<int>(c)].add(static_cast<int64_t>(bytes));
  m_stats.total.add(static_cast<int64_t>(bytes));
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

Tensor Arena::take(DType t, Shape s) {
  size_t n = round_up(s.numel() * dtype_size(t));
  if (m_dry) {
    Tensor out(reinterpret_cast<void*>(m_used + 256), t, s, Device::CPU);  // never dereferenced
    m_used += n;
    if (m_used > m_high) m_high = m_used;
    return out;
  }
  ANATOMY_CHECK(m_used + n <= m_buf.bytes(), "internal error: arena of ", m_buf.bytes(), " bytes for ",
                category_name(m_buf.category()), " overflows (", m_used, " used, ", n, " more asked)");
  Tensor out(static_cast<char*>(m_buf.data()) + m_used, t, s, m_buf.tensor().device);
  m_used += n;
  if (m_used > m_high) m_high = m_used;
  return out;
}

}  // namespace anatomy
