// Misuses of the backend ops that break the one written contract (ops/contract.cpp) the same way
// on every device: each allocates its tensors from the backend's own allocator, so only the
// shapes, dtypes or options are wrong. Run on the CPU backend, on a contract-only backend that
// claims to be CUDA (tests/unit/test_backend_contract.cpp) and on the real CUDA backend
// (tests/cuda/test_op_registry_cuda.cpp), each must throw the same message.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/backend.h"

namespace anatomy::test {

struct Misuse {
  const char* name;
  std::function<void(Backend&)> call;
};

// The message `call` throws on `be` ("" when it does not throw).
inline std::string misuse_message(Backend& be, const Misuse& m) {
  try {
    m.call(be);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::vector<Misuse> contract_misuses() {
  using B = Buffer;
  constexpr DType F32 = DType::F32, I32 = DType::I32;
  auto buf = [](Backend& be, DType dt, Shape s) { return B(be.allocator(), dt, s, Category::Temporary); };
  return {
      {"matmul inner dimensions differ",
       [=](Backend& be) {
         B c = buf(be, F32, {4, 3}), a = buf(be, F32, {4, 5}), b = buf(be, F32, {3, 6});
         be.matmul(c, a, Trans::N, b, Trans::T, {});
       }},
      // Note [fused bias gradient]: C [M, N] = A^T B with the bias gradient F32 [M].
      {"matmul bias gradient with A not transposed",
       [=](Backend& be) {
         B c = buf(be, F32, {4, 3}), a = buf(be, F32, {4, 5}), b = buf(be, F32, {3, 5}), db = buf(be, F32, {4});
         be.matmul(c, a, Trans::N, b, Trans::T, {1, 1, Epilogue::BiasGrad, db, {}});
       }},
      {"matmul bias gradient of the wrong length",
       [=](Backend& be) {
         B c = buf(be, F32, {4, 3}), a = buf(be, F32, {5, 4}), b = buf(be, F32, {5, 3}), db = buf(be, F32, {3});
         be.matmul(c, a, Trans::T, b, Trans::N, {1, 1, Epilogue::BiasGrad, db, {}});
       }},
      {"matmul bias gradient in BF16",
       [=](Backend& be) {
         B c = buf(be, F32, {4, 3}), a = buf(be, F32, {5, 4}), b = buf(be, F32, {5, 3});
         B db = buf(be, DType::BF16, {4});
         be.matmul(c, a, Trans::T, b, Trans::N, {1, 1, Epilogue::BiasGrad, db, {}});
       }},
      {"matmul bias gradient with beta 0.5",
       [=](Backend& be) {
         B c = buf(be, F32, {4, 3}), a = buf(be, F32, {5, 4}), b = buf(be, F32, {5, 3}), db = buf(be, F32, {4});
         be.matmul(c, a, Trans::T, b, Trans::N, {1, 0.5f, Epilogue::BiasGrad, db, {}});
       }},
      {"matmul bias gradient in C's memory",
       [=](Backend& be) {
         B c = buf(be, F32, {4, 1}), a = buf(be, F32, {5, 4}), b = buf(be, F32, {5, 1});
         be.matmul(c, a, Trans::T, b, Trans::N, {1, 0, Epilogue::BiasGrad, c.tensor().view({4}), {}});
       }},
      {"layernorm gamma of the wrong width",
       [=](Backend& be) {
         B y = buf(be, F32, {4, 8}), x = buf(be, F32, {4, 8}), mean = buf(be, F32, {4}), rstd = buf(be, F32, {4});
         B gamma = buf(be, F32, {7}), beta = buf(be, F32, {8});
         be.layernorm_forward(y, Tensor{}, mean, rstd, x, Tensor{}, gamma, beta, 1e-12f, {});
       }},
      {"layernorm backward bias gradient without dbranch",
       [=](Backend& be) {
         B ds = buf(be, F32, {4, 8}), dy = buf(be, F32, {4, 8}), y = buf(be, F32, {4, 8}), rstd = buf(be, F32, {4});
         B gamma = buf(be, F32, {8}), beta = buf(be, F32, {8}), db = buf(be, F32, {8});
         be.layernorm_backward(ds, Tensor{}, Tensor{}, Tensor{}, dy, y, rstd, gamma, beta, {}, db);
       }},
      {"gelu backward bias gradient of the wrong length",
       [=](Backend& be) {
         B dx = buf(be, F32, {4, 8}), dy = buf(be, F32, {4, 8}), x = buf(be, F32, {4, 8}), db = buf(be, F32, {4});
         be.gelu_backward(dx, dy, x, db);
       }},
      {"attention hidden not divisible by heads",
       [=](Backend& be) {
         B qkv = buf(be, F32, {2, 4, 3 * 6}), ctx = buf(be, F32, {2, 4, 6}), lse = buf(be, F32, {2, 4, 4});
         be.attention_forward(ctx, lse, qkv, Tensor{}, 4, {});
       }},
      // Note [attention scope]: neither its window nor its query count negative.
      {"attention scope of negative queries",
       [=](Backend& be) {
         B qkv = buf(be, F32, {2, 4, 3 * 8}), ctx = buf(be, F32, {2, 4, 8}), lse = buf(be, F32, {2, 2, 4});
         be.attention_forward(ctx, lse, qkv, Tensor{}, 2, {}, {0, -1});
       }},
      // The q|k|v bias gradient: F32 [3H], the width of dqkv.
      {"attention backward bias gradient of the wrong length",
       [=](Backend& be) {
         B qkv = buf(be, F32, {2, 4, 3 * 8}), ctx = buf(be, F32, {2, 4, 8}), lse = buf(be, F32, {2, 2, 4});
         B dqkv = buf(be, F32, {2, 4, 3 * 8}), dctx = buf(be, F32, {2, 4, 8}), db = buf(be, F32, {8});
         be.attention_backward(dqkv, dctx, qkv, ctx, lse, Tensor{}, 2, {}, {}, db);
       }},
      {"attention backward bias gradient in BF16",
       [=](Backend& be) {
         B qkv = buf(be, F32, {2, 4, 3 * 8}), ctx = buf(be, F32, {2, 4, 8}), lse = buf(be, F32, {2, 2, 4});
         B dqkv = buf(be, F32, {2, 4, 3 * 8}), dctx = buf(be, F32, {2, 4, 8}), db = buf(be, DType::BF16, {3 * 8});
         be.attention_backward(dqkv, dctx, qkv, ctx, lse, Tensor{}, 2, {}, {}, db);
       }},
      // Packed rows (Note [packed attention] in ops/cpu/attention.cpp): offsets I32 [B + 1], lse [B, heads, T].
      {"attention_packed offsets not B + 1",
       [=](Backend& be) {
         B qkv = buf(be, F32, {10, 3 * 8}), ctx = buf(be, F32, {10, 8}), lse = buf(be, F32, {2, 2, 6});
         B offsets = buf(be, I32, {2});
         be.attention_packed_forward(ctx, lse, qkv, offsets, 2, {}, 0);
       }},
      {"attention_packed lse not [B, heads, T]",
       [=](Backend& be) {
         B qkv = buf(be, F32, {10, 3 * 8}), ctx = buf(be, F32, {10, 8}), lse = buf(be, F32, {2, 12});
         B offsets = buf(be, I32, {3}), dqkv = buf(be, F32, {10, 3 * 8}), dctx = buf(be, F32, {10, 8});
         be.attention_packed_backward(dqkv, dctx, qkv, ctx, lse, offsets, 2, {}, 0);
       }},
      {"cross_entropy labels in F32",
       [=](Backend& be) {
         B losses = buf(be, F32, {3}), logits = buf(be, F32, {3, 2}), labels = buf(be, F32, {3});
         be.cross_entropy(losses, Tensor{}, logits, labels, 1.0f);
       }},
      {"select_token past the sequence",
       [=](Backend& be) {
         B out = buf(be, F32, {2, 4}), x = buf(be, F32, {2, 3, 4});
         be.select_token(out, x, 3);
       }},
      {"masked_mean mask of the wrong length",
       [=](Backend& be) {
         B out = buf(be, F32, {2, 4}), x = buf(be, F32, {2, 3, 4}), mask = buf(be, I32, {2, 4});
         be.masked_mean_forward(out, x, mask);
       }},
      {"masked_mean mask in F32",
       [=](Backend& be) {
         B dx = buf(be, F32, {2, 3, 4}), dout = buf(be, F32, {2, 4}), mask = buf(be, F32, {2, 3});
         be.masked_mean_backward(dx, dout, mask);
       }},
      {"masked_mean out of the wrong width",
       [=](Backend& be) {
         B out = buf(be, F32, {2, 3}), x = buf(be, F32, {2, 3, 4});
         be.masked_mean_forward(out, x, Tensor{});
       }},
      {"masked_mean x not [B, T, H]",
       [=](Backend& be) {
         B out = buf(be, F32, {2, 4}), x = buf(be, F32, {6, 4});
         be.masked_mean_forward(out, x, Tensor{});
       }},
      {"rotary rows in F32",
       [=](Backend& be) {
         B x = buf(be, F32, {2, 4, 12}), rows = buf(be, F32, {5});
         be.rotary_forward(x, x, 2, 10000.0f, rows);
       }},
      {"rotary rows more than B*T",
       [=](Backend& be) {
         B x = buf(be, F32, {2, 4, 12}), rows = buf(be, I32, {9});
         be.rotary_backward(x, x, 2, 10000.0f, rows);
       }},
      {"gather_rows across dtypes",
       [=](Backend& be) {
         B out = buf(be, F32, {2, 4}), in = buf(be, I32, {5, 4}), idx = buf(be, I32, {2});
         be.gather_rows(out, in, idx);
       }},
      {"embedding sequence beyond the position table",
       [=](Backend& be) {
         B e = buf(be, F32, {2 * 6, 4}), ids = buf(be, I32, {2, 6}), word = buf(be, F32, {10, 4}),
           pos = buf(be, F32, {5, 4}), type = buf(be, F32, {2, 4});
         be.embedding_forward(e, ids, Tensor{}, word, pos, type);
       }},
      {"dropout probability of one",
       [=](Backend& be) {
         B y = buf(be, F32, {8}), x = buf(be, F32, {8});
         be.dropout_forward(y, x, DropoutSpec{1.0f, 1, 0});
       }},
      {"add of different sizes",
       [=](Backend& be) {
         B y = buf(be, F32, {8}), a = buf(be, F32, {8}), b = buf(be, F32, {9});
         be.add(y, a, b);
       }},
      {"adamw second moment too short",
       [=](Backend& be) {
         B p = buf(be, F32, {10}), m = buf(be, F32, {10}), v = buf(be, F32, {9}), g = buf(be, F32, {10}),
           norm = buf(be, F32, {1});
         be.adamw_update(p, m, v, Tensor{}, g, GradTransform{norm, 1.0f, 1.0f, false}, {});
       }},
      {"clipping without a norm",
       [=](Backend& be) {
         B p = buf(be, F32, {10}), mom = buf(be, F32, {10}), g = buf(be, F32, {10});
         be.sgd_update(p, mom, Tensor{}, g, GradTransform{Tensor{}, 1.0f, 1.0f, false}, {});
       }},
      {"grad norm partials of the wrong count",
       [=](Backend& be) {
         B partials = buf(be, F32, {2}), x = buf(be, F32, {kNormBlock + 1 + kNormBlock});
         be.block_sum_squares(partials, x);
       }},
      {"undefined output",
       [=](Backend& be) {
         B x = buf(be, F32, {8});
         be.gelu_forward(Tensor{}, x);
       }},
      {"cast from ids",
       [=](Backend& be) {
         B dst = buf(be, F32, {8}), src = buf(be, I32, {8});
         be.cast(dst, src);
       }},
  };
}

}  // namespace anatomy::test
