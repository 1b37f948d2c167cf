// Evaluation during training at any world size: rank r evaluates the r-th contiguous part of the
// validation data, and the per-sample predictions, labels and losses are combined over the ranks,
// so the metrics are those of the whole set, the same at every world size.
#pragma once
#include <vector>

#include "dist/communicator.h"
#include "train/evaluate.h"

namespace anatomy {

EvalResult evaluate_over_ranks(EncoderModel& model, const Dataset& ds, const std::vector<int64_t>& lengths,
                               int64_t batch_size, Communicator& comm);

}  // namespace anatomy
