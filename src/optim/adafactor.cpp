#include "optim/adafactor.h"

#include <algorithm>

#include "model/params.h"

namespace anatomy {

namespace {

// Work per chunk of the CUDA kernels: about this many elements (whole rows for a matrix).
constexpr int64_t kChunkElements = 8192;
constexpr int64_t kStripCols = 32;  // columns per column-statistics block

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

AdafactorPlan adafactor_plan(const ParamLayout& layout) {
  AdafactorPlan plan;
  for (const ParamInfo& p : layout.params()) {
    ANATOMY_CHECK(p.shape.rank >= 1 && p.shape.rank <= 2 && p.numel() > 0, "adafactor: parameter ", p.name, " ",
                  p.shape.str(), " is not a vector or a matrix");
    AdafactorSegment s;
    s.offset = static_cast<int64_t>(p.offset);
    s.decay = p.decay ? 1 : 0;
    s.row_state = plan.state_floats;
    s.scratch = plan.scratch_floats;
    s.chunk_begin = plan.chunks;
    s.strip_begin = plan.strips;
    if (p.shape.rank == 2) {
      s.factored = 1;
      s.rows = p.shape[0];
      s.cols = p.shape[1];
      s.col_state = s.row_state + s.rows;
      plan.state_floats += s.rows + s.cols;
      s.chunk = std::max<int64_t>(1, kChunkElements / s.cols);
      s.chunks = ceil_div(s.rows, s.chunk);
      plan.scratch_floats += s.rows + 2;
      plan.strips += ceil_div(s.cols, kStripCols);
    } else {
      s.rows = 1;
      s.cols = p.shape[0];
      plan.state_floats += s.cols;
      s.chunk = kChunkElements;
      s.chunks = ceil_div(s.cols, s.chunk);
      plan.scratch_floats += s.chunks + 2;
    }
    plan.chunks += s.chunks;
    plan.segments.push_back(s);
  }
  return plan;
}

size_t adafactor_state_bytes(const ParamLayout& layout) {
  const AdafactorPlan plan = adafactor_plan(layout);
  return sizeof(float) * static_cast<size_t>(plan.state_floats + plan.scratch_floats) +
         sizeof(AdafactorSegment) * plan.segments.size();
}

namespace {

class Adafactor final : public Optimizer {
 public:
  Adafactor(Backend& be, const OptimizerOptions& o, const ParamLayout& layout)
      : m_be(be), m_opt(o), m_plan(adafactor_plan(layout)), m_n(layout.total()),
        m_state(be.allocator(), DType::F32, {m_plan.state_floats}, Category::OptimizerState),
        m_scratch(be.allocator(), DType::F32, {m_plan.scratch_floats}, Category::OptimizerState),
        m_table(be.allocator(), DType::I64,
                {static_cast<int64_t>(m_plan.segments.size()), kAdafactorSegmentFields}, Category::OptimizerState) {
    be.fill(m_state, 0.0f);
    be.fill(m_scratch, 0.0f);
    be.upload(m_table, m_plan.segments.data());
  }

  void step(const ParamGroups& p, const GradTransform& g, float lr) override {
    ANATOMY_CHECK(p.master.numel() == m_n, "adafactor: parameters of ", p.master.numel(),
                  " elements do not match the optimizer's ", m_n);
    ++m_steps;
    AdafactorArgs args;
    args.lr = lr;
    args.weight_decay = m_opt.weight_decay;
    args.step = m_steps;
    const AdafactorTable table{m_table, static_cast<int64_t>(m_plan.segments.size()), m_plan.chunks, m_plan.strips};
    m_be.adafactor_update(p.master, m_state, m_scratch, p.half_copy, p.grads, table, g, args);
  }

  std::vector<std::pair<std::string, Tensor>> state() override {
    return {{"exp_avg_sq_factored", m_state}};
  }

 private:
  Backend& m_be;
  OptimizerOptions m_opt;
  AdafactorPlan m_plan;
  size_t m_n;
  Buffer m_state, m_scratch, m_table;
};

}  // namespace

std::unique_ptr<Optimizer> make_adafactor(Backend& be, const OptimizerOptions& o, const ParamLayout& layout) {
  return std::make_unique<Adafactor>(be, o, layout);
}

}  // namespace anatomy
