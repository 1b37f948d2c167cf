// What every encoder shares of Note [gradients in freed activations] (model/bert.cpp): the
// stages of backward, the gradient ranges with the stage that first writes each, and the search
// for the gradients' offset in the activation arena.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/allocator.h"
#include "model/encoder.h"

namespace anatomy::freed {

// Stages of backward, in the order it runs: the head, layer l at L - l, the embeddings at L + 1;
// kAfterBackward for what is read after backward (the losses and logits).
constexpr int kStageHead = 0;
inline int stage_of_layer(int64_t l, int64_t L) { return static_cast<int>(L - l); }
inline int stage_of_embeddings(int64_t L) { return static_cast<int>(L + 1); }
constexpr int kAfterBackward = 1 << 30;

// A range of the flat gradients (elements) and the stage of backward that first writes it.
struct GradRange {
  size_t begin, end;
  int stage;
};

// The lowest 256-byte aligned offset of the gradients in the activation arena where no range
// overlaps a region that is read at or after the stage that first writes the range. A Region
// has the arena bytes [begin, end) and last_stage, the last stage of backward that reads them.
template <class Region>
size_t gradient_offset(const std::vector<Region>& regions, const std::vector<GradRange>& grads) {
  size_t q = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (const GradRange& g : grads)
      for (const Region& r : regions) {
        const size_t gb = 4 * g.begin, ge = 4 * g.end;
        if (r.last_stage >= g.stage && q + gb < r.end && r.begin < q + ge) {
          q = Arena::round_up(r.end - gb);
          moved = true;
        }
      }
  }
  return q;
}

// Allocates the activation arena and the fp32 gradients of `n` parameters as `bytes` (the
// model's arena bytes) lays them out: with bytes.block, one block holding both, the gradients at
// bytes.gradient_offset; else the arena alone and, when training, the gradients in a buffer of
// their own (`grads`, left empty in the shared case). `grads_view` is where they are either way.
inline void place_activations(Allocator& al, const ArenaBytes& bytes, int64_t n, bool training, SharedBlock& block,
                              Buffer& grads, Arena& arena, Tensor& grads_view) {
  if (bytes.block) {
    block = SharedBlock(al, bytes.block, Category::Activations, bytes.activations, Category::Gradients,
                        static_cast<size_t>(n) * 4);
    arena = Arena::over(block.data(), bytes.activations, al.device(), Category::Activations);
    grads_view = Tensor(block.data() + bytes.gradient_offset, DType::F32, {n}, al.device());
    return;
  }
  if (training) {
    grads = Buffer(al, DType::F32, {n}, Category::Gradients);
    grads_view = grads.tensor();
  }
  arena = Arena(al, bytes.activations, Category::Activations);
}

}  // namespace anatomy::freed
