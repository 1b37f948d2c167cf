// Element-wise ops over flat tensors: exact-erf GELU, tanh, dropout, add, casts, fill, and the
// [CLS] token select. Every map moves 16-byte packs when its pointers allow and computes in fp32.
#include <cmath>

#include "core/rng.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gelu.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

// ---- functors (element i of the flattened tensor; fp32 math) --------------------------------
// T: the storage type (Note [GELU in half precision] in gelu.cuh).
template <class T>
struct GeluF {  // x * Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)): exact, as Hugging Face BERT
  __device__ float operator()(float x, size_t) const { return gelu_value<T>(x); }
};
template <class T>
struct GeluBackF {  // dy * (Phi(x) + x phi(x))
  __device__ float operator()(float dy, float x, size_t) const { return gelu_grad<T>(dy, x); }
};
struct TanhF {
  __device__ float operator()(float x, size_t) const { return tanhf(x); }
};
struct TanhBackF {  // dy * (1 - y^2)
  __device__ float operator()(float dy, float y, size_t) const { return dy * (1.0f - y * y); }
};
struct ReluF {
  __device__ float operator()(float x, size_t) const { return x > 0.0f ? x : 0.0f; }
};
struct ReluBackF {  // from the output: dy where y > 0
  __device__ float operator()(float dy, float y, size_t) const { return y > 0.0f ? dy : 0.0f; }
};
struct AddF {
  __device__ float operator()(float a, float b, size_t) const { return a + b; }
};
struct IdentityF {
  __device__ float operator()(float x, size_t) const { return x; }
};
// Element i is kept iff dropout_keep(seed, offset, i, p) (core/rng.h, the CPU twin's mask), with
// the key and threshold computed on the host; kept values are scaled by 1/(1-p), p >= 1 drops all.
struct DropoutArgs {
  float scale;
  uint32_t thr;
  uint64_t key;
};

// ---- kernels ------------------------------------------------------------------------------------
// y[i] = op(x[i], i) over n elements: W-wide packs, then the n % W tail. In place (y == x) is
// allowed, as the model uses it (no __restrict__): each element is read before it is written, by
// the same thread.
template <class To, class Ti, int W, class Op>
__global__ void map1_kernel(To* y, const Ti* x, size_t n, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / W;
  for (size_t p = tid; p < packs; p += stride) {
    Pack<Ti, W> xi = reinterpret_cast<const Pack<Ti, W>*>(x)[p];
    Pack<To, W> yo;
#pragma unroll
    for (int j = 0; j < W; ++j) yo.v[j] = from_f32<To>(op(to_f32(xi.v[j]), p * W + j));
    reinterpret_cast<Pack<To, W>*>(y)[p] = yo;
  }
  for (size_t i = packs * W + tid; i < n; i += stride) y[i] = from_f32<To>(op(to_f32(x[i]), i));
}

// y[i] = op(a[i], b[i], i).
template <class T, int W, class Op>
__global__ void map2_kernel(T* y, const T* a, const T* b, size_t n, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / W;
  for (size_t p = tid; p < packs; p += stride) {
    Pack<T, W> ai = reinterpret_cast<const Pack<T, W>*>(a)[p];
    Pack<T, W> bi = reinterpret_cast<const Pack<T, W>*>(b)[p];
    Pack<T, W> yo;
#pragma unroll
    for (int j = 0; j < W; ++j) yo.v[j] = from_f32<T>(op(to_f32(ai.v[j]), to_f32(bi.v[j]), p * W + j));
    reinterpret_cast<Pack<T, W>*>(y)[p] = yo;
  }
  for (size_t i = packs * W + tid; i < n; i += stride) y[i] = from_f32<T>(op(to_f32(a[i]), to_f32(b[i]), i));
}

// y[i] = x[i] * factor(i): W-wide packs (W % 4 == 0: one hash per four elements, Note [dropout
// bits]), then the n % W tail. In place allowed, as map1_kernel.
template <class T, int W>
__global__ void dropout_kernel(T* y, const T* x, size_t n, DropoutArgs d) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / W;
  for (size_t p = tid; p < packs; p += stride) {
    Pack<T, W> xi = reinterpret_cast<const Pack<T, W>*>(x)[p];
    bool keep[W];
    dropout_keep_run<W>(keep, d.key, p * W, d.thr);
    Pack<T, W> yo;
#pragma unroll
    for (int j = 0; j < W; ++j) yo.v[j] = from_f32<T>(keep[j] ? to_f32(xi.v[j]) * d.scale : 0.0f);
    reinterpret_cast<Pack<T, W>*>(y)[p] = yo;
  }
  for (size_t i = packs * W + tid; i < n; i += stride)
    y[i] = from_f32<T>(dropout_keep_key(d.key, i, d.thr) ? to_f32(x[i]) * d.scale : 0.0f);
}

template <class T>
__global__ void fill_kernel(T* __restrict__ y, size_t n, T value) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = value;
}

// x [B, T, H] -> out [B, H]: row b of out is row (b*T + t) of x.
template <class T>
__global__ void select_token_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t batch, int64_t seq,
                                    int64_t hidden, int64_t t) {
  const size_t n = static_cast<size_t>(batch) * hidden;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    size_t b = i / hidden, j = i % hidden;
    out[i] = x[(b * seq + t) * hidden + j];
  }
}

// dx [B, T, H]: dout's row b at token t, zeros elsewhere (every element written).
template <class T>
__global__ void select_token_backward_kernel(T* __restrict__ dx, const T* __restrict__ dout, int64_t batch,
                                             int64_t seq, int64_t hidden, int64_t t) {
  const size_t n = static_cast<size_t>(batch) * seq * hidden;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    size_t row = i / hidden, j = i % hidden, b = row / seq;
    dx[i] = static_cast<int64_t>(row % seq) == t ? dout[b * hidden + j] : from_f32<T>(0.0f);
  }
}

// ---- launch helpers -----------------------------------------------------------------------------
constexpr int kThreads = 256;

template <class To, class Ti, class Op>
void launch_map1(To* y, const Ti* x, size_t n, Op op, cudaStream_t s) {
  if (n == 0) return;
  constexpr int W = 16 / (sizeof(To) > sizeof(Ti) ? sizeof(To) : sizeof(Ti));
  if (aligned16(y) && aligned16(x))
    map1_kernel<To, Ti, W><<<grid_for(n / W + 1, kThreads), kThreads, 0, s>>>(y, x, n, op);
  else
    map1_kernel<To, Ti, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, n, op);
  ANATOMY_CUDA_LAUNCH_CHECK();
}

template <class T, class Op>
void launch_map2(T* y, const T* a, const T* b, size_t n, Op op, cudaStream_t s) {
  if (n == 0) return;
  constexpr int W = kVec<T>;
  if (aligned16(y) && aligned16(a) && aligned16(b))
    map2_kernel<T, W><<<grid_for(n / W + 1, kThreads), kThreads, 0, s>>>(y, a, b, n, op);
  else
    map2_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(y, a, b, n, op);
  ANATOMY_CUDA_LAUNCH_CHECK();
}

template <class Op>
void unary(const char* name, const Tensor& y, const Tensor& x, Op op, cudaStream_t s) {
  dispatch_float(x.dtype, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map1(y.ptr<T>(), x.ptr<const T>(), x.numel(), op, s);
  });
}

template <class Op>
void binary(const char* name, const Tensor& y, const Tensor& a, const Tensor& b, Op op, cudaStream_t s) {
  dispatch_float(a.dtype, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map2(y.ptr<T>(), a.ptr<const T>(), b.ptr<const T>(), a.numel(), op, s);
  });
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void gelu_forward(const Tensor& y, const Tensor& x, cudaStream_t s) {
  dispatch_float(x.dtype, "gelu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map1(y.ptr<T>(), x.ptr<const T>(), x.numel(), GeluF<T>{}, s);
  });
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, cudaStream_t s) {
  dispatch_float(dx.dtype, "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map2(dx.ptr<T>(), dy.ptr<const T>(), x.ptr<const T>(), dx.numel(), GeluBackF<T>{}, s);
  });
}

void tanh_forward(const Tensor& y, const Tensor& x, cudaStream_t s) { unary("tanh_forward", y, x, TanhF{}, s); }

void tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, cudaStream_t s) {
  binary("tanh_backward", dx, dy, y, TanhBackF{}, s);
}

void relu_forward(const Tensor& y, const Tensor& x, cudaStream_t s) { unary("relu_forward", y, x, ReluF{}, s); }

void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, cudaStream_t s) {
  binary("relu_backward", dx, dy, y, ReluBackF{}, s);
}

void dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d, cudaStream_t s) {
  if (d.p <= 0.0f) {  // identity: no random numbers
    if (y.data != x.data) ANATOMY_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, x.bytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  const float scale = d.p < 1.0f ? static_cast<float>(1.0 / (1.0 - static_cast<double>(d.p))) : 0.0f;
  const DropoutArgs args{scale, dropout_threshold(d.p), dropout_key(d.seed, d.offset)};
  const size_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype, "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVec<T>;
    if (aligned16(y.data) && aligned16(x.data))
      dropout_kernel<T, W><<<grid_for(n / W + 1, kThreads), kThreads, 0, s>>>(y.ptr<T>(), x.ptr<const T>(), n, args);
    else
      dropout_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, s>>>(y.ptr<T>(), x.ptr<const T>(), n, args);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void add(const Tensor& y, const Tensor& a, const Tensor& b, cudaStream_t s) { binary("add", y, a, b, AddF{}, s); }

void cast(const Tensor& dst, const Tensor& src, cudaStream_t s) {
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data)
      ANATOMY_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch_float(dst.dtype, "cast", [&](auto to) {
    using To = typename decltype(to)::type;
    dispatch_float(src.dtype, "cast", [&](auto from) {
      using Ti = typename decltype(from)::type;
      launch_map1(dst.ptr<To>(), src.ptr<const Ti>(), src.numel(), IdentityF{}, s);
    });
  });
}

void fill(const Tensor& dst, float value, cudaStream_t s) {
  const size_t n = dst.numel();
  if (n == 0) return;
  const bool supported = dst.dtype == DType::F32 || dst.dtype == DType::BF16 || dst.dtype == DType::F16 ||
                         dst.dtype == DType::I32;
  if (supported && value == 0.0f && !std::signbit(value)) {  // +0: all bits zero in each of these types
    // The gradient zeroing (1.3 GB a bert-large step): the kernel's 4-byte stores ran at 3.3 TB/s.
    ANATOMY_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, n * dtype_size(dst.dtype), s));
    return;
  }
  const unsigned grid = grid_for(n, kThreads);
  switch (dst.dtype) {
    case DType::F32: fill_kernel<<<grid, kThreads, 0, s>>>(dst.ptr<float>(), n, value); break;
    case DType::BF16: fill_kernel<<<grid, kThreads, 0, s>>>(dst.ptr<__nv_bfloat16>(), n, __float2bfloat16_rn(value)); break;
    case DType::F16: fill_kernel<<<grid, kThreads, 0, s>>>(dst.ptr<__half>(), n, __float2half_rn(value)); break;
    case DType::I32: fill_kernel<<<grid, kThreads, 0, s>>>(dst.ptr<int32_t>(), n, static_cast<int32_t>(value)); break;
    default: fail("fill: dtype ", dtype_name(dst.dtype), " is not supported on CUDA (F32, BF16, F16, I32)");
  }
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void select_token(const Tensor& out, const Tensor& x, int64_t t, cudaStream_t s) {
  const int64_t batch = x.dim(0), seq = x.dim(1), hidden = x.dim(2);
  if (out.numel() == 0) return;
  dispatch_float(x.dtype, "select_token", [&](auto tag) {
    using T = typename decltype(tag)::type;
    select_token_kernel<<<grid_for(out.numel(), kThreads), kThreads, 0, s>>>(out.ptr<T>(), x.ptr<const T>(), batch,
                                                                             seq, hidden, t);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t, cudaStream_t s) {
  const int64_t batch = dx.dim(0), seq = dx.dim(1), hidden = dx.dim(2);
  if (dx.numel() == 0) return;
  dispatch_float(dx.dtype, "select_token_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    select_token_backward_kernel<<<grid_for(dx.numel(), kThreads), kThreads, 0, s>>>(
        dx.ptr<T>(), dout.ptr<const T>(), batch, seq, hidden, t);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
