// The memory anatomy's categories: every device byte belongs to exactly one.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace anatomy {

enum class Category : uint8_t {
  Weights,         // fp32 master weights and their half-precision compute copy
  OptimizerState,  // AdamW moments, SGD momentum, Adafactor factors, quantization scales
  Gradients,       // parameter gradients (fp32)
  Activations,     // tensors saved in forward for backward
  Temporary,       // scratch that lives within one op or one layer's backward
  Workspace,       // library workspaces (cuBLASLt, cuDNN)
  Other,           // data batches, loss, metrics, communication buffers
};
constexpr int kNumCategories = 7;

constexpr std::string_view category_name(Category c) {
  constexpr std::array<std::string_view, kNumCategories> names = {
      "weights", "optimizer_state", "gradients", "activations", "temporary", "workspace", "other"};
  return names[static_cast<int>(c)];
}

// Bytes per category; shared by the allocator's statistics and the planner's prediction.
// `shared` counts bytes that belong to two categories at once (gradients written into
// activation memory that backward has finished with: Note [gradients in freed activations] in
// model/bert.cpp): each category shows its full size, and the total counts those bytes once.
struct CategoryBytes {
  std::array<int64_t, kNumCategories> v{};
  int64_t shared = 0;
  int64_t& operator[](Category c) { return v[static_cast<int>(c)]; }
  int64_t operator[](Category c) const { return v[static_cast<int>(c)]; }
  int64_t total() const {
    int64_t t = -shared;
    for (int64_t x : v) t += x;
    return t;
  }
};
constexpr std::string_view kSharedName = "gradients_in_activations";

}  // namespace anatomy
