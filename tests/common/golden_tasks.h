// The float-label golden fixtures (tests/data/golden_tasks, written by
// tests/golden/make_golden_tasks.py): their directory, labels F32 [B, num_labels] and device
// batch. Shared by the CPU test (tests/unit/test_golden_tasks.cpp) and the GPU test
// (tests/cuda/test_golden_tasks_cuda.cpp).
#pragma once
#include <string>
#include <vector>

#include "golden.h"

namespace anatomy::golden {

inline std::string task_dir(const std::string& name) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_tasks/" + name;
}

inline const std::vector<const char*>& task_cases() {
  static const std::vector<const char*> cases{"bert-regression",        "roberta-regression2",
                                              "roberta-multilabel",     "distilbert-multilabel",
                                              "bert-multilabel",        "xlm-roberta-regression",
                                              "xlm-roberta-multilabel", "electra-regression",
                                              "electra-multilabel",     "distilbert-regression3"};
  return cases;
}

// The fixture with its labels read as floats (Fixture reads labels as integers).
struct TaskFixture {
  std::string dir;
  Fixture f;
  std::vector<float> labels;
  explicit TaskFixture(const std::string& name) : dir(task_dir(name)), f(dir), labels(read_f32(f.ref, "labels")) {}
};

// The fixture's batch with its F32 [B, C] labels on the device.
struct FloatBatch {
  Buffer ids, types, mask, labels;
  DeviceBatch db;
  FloatBatch(Backend& be, const TaskFixture& t)
      : ids(be.allocator(), DType::I32, {t.f.B, t.f.T}, Category::Other),
        types(be.allocator(), DType::I32, {t.f.B, t.f.T}, Category::Other),
        mask(be.allocator(), DType::I32, {t.f.B, t.f.T}, Category::Other),
        labels(be.allocator(), DType::F32, {t.f.B, t.f.cfg.num_labels}, Category::Other) {
    be.upload(ids, t.f.ids.data());
    be.upload(types, t.f.types.data());
    be.upload(mask, t.f.mask.data());
    be.upload(labels, t.labels.data());
    db = {ids, types, mask, labels};
  }
};

inline std::string case_test_name(const char* c) {
  std::string s = c;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

}  // namespace anatomy::golden
