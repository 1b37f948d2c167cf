// The per-op registry on the CPU (tests/common/op_registry.h): every backend op has an entry,
// every entry runs on the CPU backend and writes every output, and every op with a backward
// passes the float64 finite-difference check of its reference (formerly test_cpu_grad.cpp).
// The CUDA twin mode is tests/cuda/test_op_registry_cuda.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "../common/op_registry.h"
#include "test_cpu_util.h"

using namespace anatomy;
using namespace anatomy::test;

namespace {

// The ops ops/backend.h declares: one protected virtual *_impl each.
std::set<std::string> declared_ops() {
  std::ifstream f(std::string(ANATOMY_SOURCE_DIR) + "/src/ops/backend.h");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::set<std::string> ops;
  const std::regex impl(R"(virtual\s+\w+\s+(\w+)_impl\()");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), impl); it != std::sregex_iterator(); ++it)
    ops.insert((*it)[1]);
  return ops;
}

std::vector<std::string> entry_names(bool with_gradient) {
  std::vector<std::string> v;
  for (const OpEntry& e : op_registry())
    if (!with_gradient || e.gradient) v.push_back(e.op);
  return v;
}

}  // namespace

TEST(OpRegistry, EveryBackendOpHasAnEntry) {
  const std::set<std::string> declared = declared_ops();
  ASSERT_GE(declared.size(), 30u) << "the *_impl declarations of ops/backend.h were not found";
  std::set<std::string> registered;
  for (const OpEntry& e : op_registry()) {
    EXPECT_TRUE(registered.insert(e.op).second) << e.op << " has two entries";
    EXPECT_TRUE(declared.count(e.op)) << e.op << " is not a Backend op";
  }
  for (const std::string& op : declared) EXPECT_TRUE(registered.count(op)) << op << " has no registry entry";
}

class OpRegistryCpu : public ::testing::TestWithParam<std::string> {};

// Outputs start as NaN: each must come back written and finite.
TEST_P(OpRegistryCpu, RunsAndWritesEveryOutput) {
  const OpEntry& e = *find_op(GetParam());
  ANATOMY_FRESH_RNG(rng);
  auto cpu = make_cpu_backend(2);
  for (const OpDims& dims : {OpDims{}, odd_dims()}) {
    const OpCase c = e.build(dims, rng);
    std::vector<std::vector<double>> values;
    for (const OpArg& a : c.args) values.push_back(arg_values(a, DType::F32));
    CaseTensors t = make_tensors(*cpu, c, DType::F32, values);
    c.run(*cpu, t.tensors);
    int compared = 0;
    for (size_t i = 0; i < c.args.size(); ++i) {
      if (!c.args[i].compared) continue;
      ++compared;
      const std::vector<double> got = read_values(*cpu, t.tensors[i]);
      size_t bad = 0;
      for (double x : got) bad += !std::isfinite(x);
      EXPECT_EQ(bad, 0u) << c.args[i].name << ": " << bad << " of " << got.size()
                         << " elements not written or not finite";
    }
    EXPECT_GT(compared, 0) << "the entry compares nothing";
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, OpRegistryCpu, ::testing::ValuesIn(entry_names(false)),
                         [](const auto& info) { return info.param; });

class OpGradient : public ::testing::TestWithParam<std::string> {};

TEST_P(OpGradient, MatchesCentralDifferencesInDouble) {
  ANATOMY_FRESH_RNG(rng);
  find_op(GetParam())->gradient(rng);
}

INSTANTIATE_TEST_SUITE_P(Registry, OpGradient, ::testing::ValuesIn(entry_names(true)),
                         [](const auto& info) { return info.param; });
