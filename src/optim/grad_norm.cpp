#include "optim/grad_norm.h"

#include "core/error.h"

namespace anatomy {

GradNorm::GradNorm(Backend& be, size_t n)
    : m_be(be), m_n(n), m_buf(be.allocator(), DType::F32, {static_cast<int64_t>(1 + blocks(n))}, Category::Other) {
  const Tensor all = m_buf.tensor();
  m_norm = all.slice(0, 1);
  m_partials = all.slice(1, all.numel());
}

void GradNorm::compute(const Tensor& grads) {
  ANATOMY_CHECK(grads.numel() == m_n, "internal error: GradNorm over ", m_n, " elements got ", grads.numel());
  m_be.block_sum_squares(m_partials, grads.view({static_cast<int64_t>(m_n)}));
  finish();
}

void GradNorm::compute_range(const Tensor& grads, size_t begin, size_t end) {
  ANATOMY_CHECK(grads.numel() == m_n && begin <= end && end <= m_n && begin % kNormBlock == 0 &&
                    (end % kNormBlock == 0 || end == m_n),
                "internal error: GradNorm range [", begin, ", ", end, ") of ", m_n, " is not block-aligned");
  m_be.fill(m_partials, 0.0f);
  if (begin == end) return;
  const Tensor flat = grads.view({static_cast<int64_t>(m_n)}).slice(static_cast<int64_t>(begin), static_cast<int64_t>(end));
  m_be.block_sum_squares(m_partials.slice(static_cast<int64_t>(begin / kNormBlock), static_cast<int64_t>(blocks(end))), flat);
}

void GradNorm::finish() { m_be.sum_blocks(m_norm, m_partials); }

}  // namespace anatomy
