// What every encoder shares of Note [gradients in freed activations] (model/bert.cpp): the
// stages of backward, the gradient ranges with the stage that first writes each, and the search
// for the gradients' offset in the activation arena.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/allocator.h"

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

}  // namespace anatomy::freed
