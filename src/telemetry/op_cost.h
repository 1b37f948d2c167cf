// What each op must do: floating-point operations and the fewest bytes it must move (each
// input read once, each output written once), and its class in the seed page's taxonomy.
// The profiler divides these by measured time to place every op on the roofline.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "ops/backend.h"

namespace anatomy {

// OpClass and OpCost live in ops/observer.h (the backend reports them with each op).
std::string_view op_class_name(OpClass c);

// C[M,N] = op(A) op(B) (+ beta C) (+ bias) (+ GELU).
OpCost matmul_cost(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, const MatmulArgs& args);
// Forward: S = QK^T and O = PV, 4 B h T^2 D flops; backward recomputes S and does 4 more
// products: 10 B h T^2 D. queries > 0 (Note [attention scope] in ops/op_args.h): the first
// min(queries, T) queries' share, the pairs the caller asked for.
OpCost attention_cost(const Tensor& qkv, const Tensor& ctx, int heads, int queries, bool backward);
// The packed form over N rows: its FLOPs count the (query, key) pairs the caller passes.
OpCost packed_attention_cost(const Tensor& qkv, const Tensor& ctx, const Tensor& lse, int heads, int64_t pairs,
                             bool backward);
// Per element: LayerNorm forward ~8 flops (add, mean, var, normalize, scale, shift),
// backward ~16 (xhat from the output); bytes of the tensors it reads and writes.
OpCost layernorm_cost(const Tensor& y, bool has_residual, bool backward, bool stores_sum = false);
// rows x classes softmax with the loss and its gradient: ~5 flops per logit.
OpCost cross_entropy_cost(const Tensor& logits);
// mse_loss and bce_with_logits: read logits and F32 targets, write dlogits and the losses.
OpCost float_target_loss_cost(const Tensor& logits);
// n elements, `flops_per` each, reading `reads` tensors and writing `writes` of the same size.
OpCost elementwise_cost(const Tensor& t, double flops_per, int reads, int writes, OpClass cls = OpClass::Elementwise);
// 8-bit AdamW: params and grads F32 read, params written, both U8 code arrays read and written.
OpCost adamw8bit_cost(const Tensor& params, const Tensor& half_copy);
// Adafactor: grads read twice (statistics, update), the state read and written.
OpCost adafactor_cost(const Tensor& params, const Tensor& state, const Tensor& half_copy);

}  // namespace anatomy
