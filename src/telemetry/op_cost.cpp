#include "telemetry/op_cost.h"

#include <algorithm>

namespace anatomy {

std::string_view op_class_name(OpClass c) {
  switch (c) {
    case OpClass::TensorContraction: return "tensor_contraction";
    case OpClass::StatisticalNormalization: return "statistical_normalization";
    case OpClass::Elementwise: return "elementwise";
    case OpClass::Optimizer: return "optimizer";
    case OpClass::Data: return "data";
  }
  return "?";
}

static double nbytes(const Tensor& t) { return static_cast<double>(t.bytes()); }

OpCost matmul_cost(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, const MatmulArgs& args) {
  const double M = static_cast<double>(c.dim(0)), N = static_cast<double>(c.dim(1));
  const double K = static_cast<double>(ta == Trans::N ? a.dim(1) : a.dim(0));
  OpCost o{2 * M * N * K, nbytes(a) + nbytes(b) + nbytes(c), OpClass::TensorContraction};
  if (args.beta != 0) o.bytes += nbytes(c);
  if (args.epilogue == Epilogue::BiasGrad) {  // column sums of A [K, M] into bias [M] (read too with beta 1)
    o.flops += M * K;
    o.bytes += nbytes(args.bias) * (args.beta != 0 ? 2 : 1);
  } else if (args.epilogue != Epilogue::None) {
    o.flops += M * N;
    o.bytes += nbytes(args.bias);
  }
  if (args.epilogue == Epilogue::BiasGelu) {
    o.flops += 8 * M * N;  // erf-GELU, counted as a handful of operations per element
    o.bytes += nbytes(args.gelu_in);
  }
  return o;
}

OpCost attention_cost(const Tensor& qkv, const Tensor& ctx, int heads, int queries, bool backward) {
  const double B = static_cast<double>(qkv.dim(0)), T = static_cast<double>(qkv.dim(1));
  const double Q = queries > 0 ? std::min(T, static_cast<double>(queries)) : T;
  const double H = static_cast<double>(ctx.dim(-1)), D = H / heads;
  const double lse = B * heads * T * 4;
  if (!backward) return {4 * B * heads * Q * T * D, nbytes(qkv) + nbytes(ctx) + lse, OpClass::TensorContraction};
  // Reads qkv, ctx, dctx, lse; writes dqkv.
  return {10 * B * heads * Q * T * D, 2 * nbytes(qkv) + 2 * nbytes(ctx) + lse, OpClass::TensorContraction};
}

OpCost packed_attention_cost(const Tensor& qkv, const Tensor& ctx, const Tensor& lse_t, int heads, int64_t pairs,
                             bool backward) {
  const double H = static_cast<double>(ctx.dim(-1)), D = H / heads, P = static_cast<double>(pairs);
  const double lse = nbytes(lse_t);  // [B, heads, T], written whole (0 past a sequence's end)
  if (!backward) return {4 * heads * P * D, nbytes(qkv) + nbytes(ctx) + lse, OpClass::TensorContraction};
  return {10 * heads * P * D, 2 * nbytes(qkv) + 2 * nbytes(ctx) + lse, OpClass::TensorContraction};
}

OpCost layernorm_cost(const Tensor& y, bool has_residual, bool backward, bool stores_sum) {
  const double n = static_cast<double>(y.numel()), e = static_cast<double>(dtype_size(y.dtype));
  const double rows = static_cast<double>(y.dim(0));
  if (!backward)  // read branch (+ residual); write y (and sum); write mean, rstd
    return {8 * n, n * e * (2 + (has_residual ? 1 : 0) + (stores_sum ? 1 : 0)) + rows * 8,
            OpClass::StatisticalNormalization};
  // read dy and y, write dsum (and dbranch); read rstd
  return {16 * n, n * e * (has_residual ? 4 : 3) + rows * 4, OpClass::StatisticalNormalization};
}

OpCost cross_entropy_cost(const Tensor& logits) {
  const double n = static_cast<double>(logits.numel());
  return {5 * n, 2 * nbytes(logits) + static_cast<double>(logits.dim(0)) * 8, OpClass::StatisticalNormalization};
}

OpCost float_target_loss_cost(const Tensor& logits) {
  const double n = static_cast<double>(logits.numel());
  return {8 * n, 2 * nbytes(logits) + 4 * n + static_cast<double>(logits.dim(0)) * 4,
          OpClass::StatisticalNormalization};
}

OpCost elementwise_cost(const Tensor& t, double flops_per, int reads, int writes, OpClass cls) {
  const double n = static_cast<double>(t.numel());
  return {flops_per * n, (reads + writes) * nbytes(t), cls};
}

OpCost adamw8bit_cost(const Tensor& params, const Tensor& half_copy) {
  OpCost c = elementwise_cost(params, 24, 2, 1, OpClass::Optimizer);
  c.bytes += 4.0 * static_cast<double>(params.numel()) + nbytes(half_copy);
  return c;
}

OpCost adafactor_cost(const Tensor& params, const Tensor& state, const Tensor& half_copy) {
  OpCost c = elementwise_cost(params, 12, 3, 1, OpClass::Optimizer);
  c.bytes += 2 * nbytes(state) + nbytes(half_copy);
  return c;
}

}  // namespace anatomy
