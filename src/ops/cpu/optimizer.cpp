// Optimizer updates and the gradient-norm reduction they read (GradTransform in backend.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"
#include "ops/optim_math.h"

namespace anatomy::ref {

// Note [canonical gradient norm]: threads split the blocks, never a block, so the result does
// not depend on the thread count or the vector width.
template <class T>
void block_sum_squares(T* partials, const T* x, size_t n, size_t block) {
  const int64_t blocks = static_cast<int64_t>((n + block - 1) / block);
#pragma omp parallel for if (static_cast<int64_t>(n) > kParallelWork)
  for (int64_t k = 0; k < blocks; ++k) {
    const size_t b = static_cast<size_t>(k) * block, e = std::min(n, b + block);
    double s = 0;
    for (size_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    partials[k] = static_cast<T>(s);
  }
}

template <class T>
void sum_blocks(T* out, const T* partials, size_t n) {
  double s = 0;
  for (size_t k = 0; k < n; ++k) s += static_cast<double>(partials[k]);
  out[0] = static_cast<T>(s);
}

double grad_factor(double norm_sq, double inv_loss_scale, double max_norm) {
  double clip = 1.0;
  if (max_norm > 0) {
    const double norm = std::sqrt(norm_sq) * inv_loss_scale;
    clip = std::fmin(1.0, max_norm / (norm + 1e-6));
  }
  return inv_loss_scale * clip;
}

template <class T>
void adamw_update(T* params, T* m, T* v, const T* grads, size_t n, double factor,
                  const AdamWArgs& a) {
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
  const double step = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for if (count > kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    const double g = grads[i] * factor;
    double p = params[i];
    p -= lr * wd * p;  // decoupled weight decay, on the pre-update parameter
    const double mi = b1 * m[i] + (1.0 - b1) * g;
    const double vi = b2 * v[i] + (1.0 - b2) * g * g;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    params[i] = static_cast<T>(p);
  }
}

template <class T>
void sgd_update(T* params, T* buf, const T* grads, size_t n, double factor, const SgdArgs& a) {
  const double lr = a.lr, mom = a.momentum, wd = a.weight_decay;
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for if (count > kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    double g = grads[i] * factor + wd * params[i];
    if (mom != 0.0) {
      const double b = mom * buf[i] + g;
      buf[i] = static_cast<T>(b);
      g = a.nesterov ? g + mom * b : b;
    }
    params[i] = static_cast<T>(params[i] - lr * g);
  }
}

// om::quantize over a block, with the binary searches of all its values advanced level by level:
// independent loads instead of one dependent chain per value (several times faster on a CPU),
// the same comparisons, hence the same codes.
template <class T>
void quantize_block(uint8_t* codes, const float* map, const T* x, T absmax, size_t n, bool positive_nonzero) {
  T xn[kQuantBlock];
  int below[kQuantBlock];
  for (size_t j = 0; j < n; ++j) {
    xn[j] = om::normalized(x[j], absmax);
    below[j] = 0;
  }
  for (int step = 128; step > 0; step >>= 1)
    for (size_t j = 0; j < n; ++j) below[j] += static_cast<int>(static_cast<T>(map[below[j] + step - 1]) < xn[j]) * step;
  for (size_t j = 0; j < n; ++j) codes[j] = om::code_of(map, xn[j], below[j], positive_nonzero);
}

template <class T>
void adamw8bit_update(float* params, uint8_t* m_codes, uint8_t* v_codes, float* m_absmax, float* v_absmax,
                      const float* grads, const float* qmap, size_t n, T factor, const AdamWArgs& a) {
  const om::AdamConsts<T> c = om::adam_consts<T>(a);
  const float* smap = qmap;        // m: signed
  const float* umap = qmap + 256;  // v: unsigned
  const int64_t blocks = static_cast<int64_t>((n + kQuantBlock - 1) / kQuantBlock);
#pragma omp parallel for if (static_cast<int64_t>(n) > kParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t lo = static_cast<size_t>(b * kQuantBlock), hi = std::min(n, lo + kQuantBlock);
    T m[kQuantBlock], v[kQuantBlock];
    const T ma = m_absmax[b], va = v_absmax[b];
    T am = 0, av = 0;
    for (size_t i = lo; i < hi; ++i) {
      T mi = om::dequantize(smap, m_codes[i], ma), vi = om::dequantize(umap, v_codes[i], va);
      const T g = om::mul(static_cast<T>(grads[i]), factor);
      params[i] = static_cast<float>(om::adam_element(static_cast<T>(params[i]), mi, vi, g, c));
      m[i - lo] = mi;
      v[i - lo] = vi;
      am = om::max_ignore_nan(am, std::fabs(mi));
      av = om::max_ignore_nan(av, vi);
    }
    // The scales are stored in F32; quantize against the stored values.
    m_absmax[b] = static_cast<float>(am);
    v_absmax[b] = static_cast<float>(av);
    quantize_block(m_codes + lo, smap, m, static_cast<T>(m_absmax[b]), hi - lo, false);
    quantize_block(v_codes + lo, umap, v, static_cast<T>(v_absmax[b]), hi - lo, true);
  }
}

template <class T>
void adafactor_update(T* params, T* state, const T* grads, const AdafactorSegment* segs, size_t count,
                      double factor, const AdafactorArgs& a) {
  const double beta2t = 1.0 - std::pow(static_cast<double>(a.step), static_cast<double>(a.decay_rate));
  const double eps1 = a.eps1, lr = a.lr, clip = a.clip_threshold;
  for (size_t s = 0; s < count; ++s) {
    const AdafactorSegment& sg = segs[s];
    const int64_t R = sg.rows, C = sg.cols, numel = R * C;
    T* p = params + sg.offset;
    const T* gr = grads + sg.offset;
    const double wd = sg.decay ? static_cast<double>(a.weight_decay) : 0.0;
    // u(i) for element i: the unclipped update.
    std::vector<double> rf, cf;  // factored: rsqrt(row / mean(row)), rsqrt(col)
    T* v = state + sg.row_state;
    if (sg.factored) {
      T* row = state + sg.row_state;
      T* col = state + sg.col_state;
#pragma omp parallel for if (numel > kParallelWork)
      for (int64_t i = 0; i < R; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < C; ++j) {
          const double g = gr[i * C + j] * factor;
          sum += g * g + eps1;
        }
        row[i] = static_cast<T>(beta2t * row[i] + (1.0 - beta2t) * (sum / static_cast<double>(C)));
      }
      std::vector<double> colsum(static_cast<size_t>(C), 0.0);
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = 0; j < C; ++j) {
          const double g = gr[i * C + j] * factor;
          colsum[j] += g * g + eps1;
        }
      for (int64_t j = 0; j < C; ++j)
        col[j] = static_cast<T>(beta2t * col[j] + (1.0 - beta2t) * (colsum[j] / static_cast<double>(R)));
      double row_mean = 0;
      for (int64_t i = 0; i < R; ++i) row_mean += row[i];
      row_mean /= static_cast<double>(R);
      rf.resize(static_cast<size_t>(R));
      cf.resize(static_cast<size_t>(C));
      for (int64_t i = 0; i < R; ++i) rf[i] = 1.0 / std::sqrt(row[i] / row_mean);
      for (int64_t j = 0; j < C; ++j) cf[j] = 1.0 / std::sqrt(static_cast<double>(col[j]));
    } else {
#pragma omp parallel for if (numel > kParallelWork)
      for (int64_t i = 0; i < numel; ++i) {
        const double g = gr[i] * factor;
        v[i] = static_cast<T>(beta2t * v[i] + (1.0 - beta2t) * (g * g + eps1));
      }
    }
    auto update = [&](int64_t i) {
      const double g = gr[i] * factor;
      return sg.factored ? g * rf[i / C] * cf[i % C] : g / std::sqrt(static_cast<double>(v[i]));
    };
    double sumsq = 0;
#pragma omp parallel for reduction(+ : sumsq) if (numel > kParallelWork)
    for (int64_t i = 0; i < numel; ++i) {
      const double u = update(i);
      sumsq += u * u;
    }
    const double denom = std::max(1.0, std::sqrt(sumsq / static_cast<double>(numel)) / clip);
#pragma omp parallel for if (numel > kParallelWork)
    for (int64_t i = 0; i < numel; ++i) {
      double pi = p[i];
      pi -= wd * lr * pi;
      pi -= lr * (update(i) / denom);
      p[i] = static_cast<T>(pi);
    }
  }
}

#define ANATOMY_INSTANTIATE(T)                                                                                \
  template void block_sum_squares<T>(T*, const T*, size_t, size_t);                                            \
  template void sum_blocks<T>(T*, const T*, size_t);                                                         \
  template void adamw_update<T>(T*, T*, T*, const T*, size_t, double, const AdamWArgs&);                      \
  template void sgd_update<T>(T*, T*, const T*, size_t, double, const SgdArgs&);                              \
  template void adamw8bit_update<T>(float*, uint8_t*, uint8_t*, float*, float*, const float*, const float*, \
                                    size_t, T, const AdamWArgs&);                                             \
  template void adafactor_update<T>(T*, T*, const T*, const AdafactorSegment*, size_t, double, const AdafactorArgs&);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
