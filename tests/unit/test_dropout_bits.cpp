// The dropout mask (Note [dropout bits] in core/rng.h): one 64-bit hash decides four elements.
// The kept fraction is 1 - p within 4 sigma, on every field of the group; the four decisions of
// a group are independent of each other; an element's decision does not depend on how it is
// asked (alone, or with its group, or in an unaligned run); the attention index (Note
// [attention dropout index]) is a bijection onto 2x2 blocks; and the CPU backend's ops use it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/rng.h"
#include "ops/backend.h"

using namespace anatomy;

namespace {

// |observed - expected| in units of the binomial sigma of n trials.
double sigmas(int64_t hits, int64_t n, double prob) {
  const double sd = std::sqrt(prob * (1.0 - prob) / static_cast<double>(n));
  return std::fabs(static_cast<double>(hits) / static_cast<double>(n) - prob) / sd;
}

}  // namespace

TEST(DropoutBits, Threshold) {
  EXPECT_EQ(dropout_threshold(0.0f), 0u);
  EXPECT_EQ(dropout_threshold(-1.0f), 0u);
  EXPECT_EQ(dropout_threshold(0.5f), 32768u);
  EXPECT_EQ(dropout_threshold(0.1f), 6554u);  // ceil(6553.6)
  EXPECT_EQ(dropout_threshold(1e-9f), 1u);    // any p > 0 drops something
  EXPECT_EQ(dropout_threshold(0.99999f), 65536u);
  EXPECT_EQ(dropout_threshold(1.0f), 65536u);
  // p >= 1 keeps nothing (16-bit fields are < 65536); p = 0 keeps everything.
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_FALSE(dropout_keep(3, 4, i, 1.0f));
    EXPECT_TRUE(dropout_keep(3, 4, i, 0.0f));
  }
}

// Over 1e6 elements the kept fraction is within 4 sigma of 1 - p, overall and per field.
TEST(DropoutBits, KeptFractionIsOneMinusP) {
  const int64_t n = 1000000;
  for (float p : {0.1f, 0.5f}) {
    for (uint64_t offset : {0ull, 77ull, 1ull << 40}) {
      SCOPED_TRACE("p " + std::to_string(p) + " offset " + std::to_string(offset));
      int64_t kept = 0, field_kept[4] = {0, 0, 0, 0};
      for (int64_t i = 0; i < n; ++i) {
        const bool k = dropout_keep(1234, offset, static_cast<uint64_t>(i), p);
        kept += k;
        field_kept[i & 3] += k;
      }
      EXPECT_LT(sigmas(kept, n, 1.0 - p), 4.0) << kept << " of " << n;
      for (int f = 0; f < 4; ++f) EXPECT_LT(sigmas(field_kept[f], n / 4, 1.0 - p), 4.0) << "field " << f;
    }
  }
}

// Within a group, each pair of fields is kept together with probability (1-p)^2 (independent
// decisions), and so are the same field of neighbouring groups.
TEST(DropoutBits, GroupMatesAreIndependent) {
  const int64_t groups = 250000;
  for (float p : {0.1f, 0.5f}) {
    SCOPED_TRACE("p " + std::to_string(p));
    const uint64_t key = dropout_key(99, 5);
    const uint32_t thr = dropout_threshold(p);
    int64_t both[4][4] = {}, next[4] = {};
    for (int64_t g = 0; g < groups; ++g) {
      const uint64_t bits = dropout_group_bits(key, static_cast<uint64_t>(g));
      const uint64_t bits1 = dropout_group_bits(key, static_cast<uint64_t>(g + 1));
      bool k[4];
      for (int f = 0; f < 4; ++f) k[f] = dropout_field_keep(bits, f, thr);
      for (int a = 0; a < 4; ++a) {
        for (int b = a + 1; b < 4; ++b) both[a][b] += k[a] && k[b];
        next[a] += k[a] && dropout_field_keep(bits1, a, thr);
      }
    }
    const double q = (1.0 - p) * (1.0 - p);
    for (int a = 0; a < 4; ++a) {
      for (int b = a + 1; b < 4; ++b) EXPECT_LT(sigmas(both[a][b], groups, q), 4.0) << "fields " << a << ", " << b;
      EXPECT_LT(sigmas(next[a], groups, q), 4.0) << "field " << a << " of neighbouring groups";
    }
  }
}

// Element i's decision is the same whichever way it is asked: alone, through its group's bits,
// or in a run of 4 or 8 (aligned: one hash per group; unaligned: one per element).
TEST(DropoutBits, DecisionDoesNotDependOnWhoAsks) {
  const uint64_t key = dropout_key(7, 3);
  const uint32_t thr = dropout_threshold(0.3f);
  for (uint64_t i = 0; i < 4096; ++i) {
    const bool alone = dropout_keep_key(key, i, thr);
    ASSERT_EQ(alone, dropout_keep(7, 3, i, 0.3f));
    ASSERT_EQ(alone, dropout_field_keep(dropout_group_bits(key, i / 4), static_cast<int>(i % 4), thr));
  }
  for (uint64_t start = 0; start < 64; ++start) {
    bool k8[8], k4[4], k1[1];
    dropout_keep_run<8>(k8, key, start, thr);
    dropout_keep_run<4>(k4, key, start, thr);
    dropout_keep_run<1>(k1, key, start, thr);
    for (int j = 0; j < 8; ++j) ASSERT_EQ(k8[j], dropout_keep_key(key, start + j, thr)) << start << "+" << j;
    for (int j = 0; j < 4; ++j) ASSERT_EQ(k4[j], dropout_keep_key(key, start + j, thr)) << start << "+" << j;
    ASSERT_EQ(k1[0], dropout_keep_key(key, start, thr));
  }
}

// Note [dropout mix] at the attention layout's strides: the groups beside a 2x2 block along its
// row (the next two keys) and its column (the next two queries), and the same block of the next
// head, are kept together with probability (1-p)^2, field by field.
TEST(DropoutBits, AttentionNeighboursAreIndependent) {
  const uint64_t T = 512;
  const float p = 0.5f;
  int64_t n = 0, row = 0, col = 0, head = 0;
  for (uint64_t q = 0; q + 2 < T; q += 3)
    for (uint64_t k = 0; k + 2 < T; ++k) {
      const bool a = dropout_keep(5, 6, attention_dropout_index(3, q, k, T), p);
      row += a && dropout_keep(5, 6, attention_dropout_index(3, q, k + 2, T), p);
      col += a && dropout_keep(5, 6, attention_dropout_index(3, q + 2, k, T), p);
      head += a && dropout_keep(5, 6, attention_dropout_index(4, q, k, T), p);
      ++n;
    }
  EXPECT_LT(sigmas(row, n, 0.25), 4.0) << row << " of " << n;
  EXPECT_LT(sigmas(col, n, 0.25), 4.0) << col << " of " << n;
  EXPECT_LT(sigmas(head, n, 0.25), 4.0) << head << " of " << n;
}

// Distinct (seed, offset) streams agree only as independent masks would: p^2 + (1-p)^2.
TEST(DropoutBits, StreamsAreIndependent) {
  const int64_t n = 400000;
  const float p = 0.5f;
  int64_t same_offset = 0, same_seed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool a = dropout_keep(1, 10, static_cast<uint64_t>(i), p);
    same_offset += a == dropout_keep(2, 10, static_cast<uint64_t>(i), p);
    same_seed += a == dropout_keep(1, 11, static_cast<uint64_t>(i), p);
  }
  EXPECT_LT(sigmas(same_offset, n, 0.5), 4.0);
  EXPECT_LT(sigmas(same_seed, n, 0.5), 4.0);
}

// The attention index maps (bh, q, k) one to one, and a group of four is a 2x2 block.
TEST(DropoutBits, AttentionIndexIsA2x2BlockBijection) {
  for (uint64_t T : {1ull, 2ull, 7ull, 8ull, 33ull}) {
    SCOPED_TRACE("T " + std::to_string(T));
    std::set<uint64_t> seen;
    for (uint64_t bh = 0; bh < 3; ++bh)
      for (uint64_t q = 0; q < T; ++q)
        for (uint64_t k = 0; k < T; ++k) {
          const uint64_t i = attention_dropout_index(bh, q, k, T);
          ASSERT_TRUE(seen.insert(i).second) << "duplicate index for " << bh << ", " << q << ", " << k;
          ASSERT_EQ(i >> 2, attention_dropout_index(bh, q & ~1ull, k & ~1ull, T) >> 2);
          ASSERT_EQ(i & 3, (q & 1) * 2 + (k & 1));
        }
  }
  // The kept fraction over attention-shaped indices.
  const uint64_t T = 512;
  int64_t kept = 0, n = 0;
  for (uint64_t q = 0; q < T; ++q)
    for (uint64_t k = 0; k < T; k += 1) {
      kept += dropout_keep(5, 6, attention_dropout_index(17, q, k, T), 0.1f);
      ++n;
    }
  EXPECT_LT(sigmas(kept, n, 0.9), 4.0);
}

// The CPU backend's dropout is this mask: y[i] = x[i] / (1-p) or 0 as dropout_keep says.
TEST(DropoutBits, CpuDropoutOpUsesTheMask) {
  auto be = make_cpu_backend(2);
  const int64_t n = 1001;
  const DropoutSpec d{0.25f, 42, 9};
  std::vector<float> x(n, 1.0f), y(n, NAN);
  be->dropout_forward(Tensor(y.data(), DType::F32, {n}, Device::CPU), Tensor(x.data(), DType::F32, {n}, Device::CPU), d);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(y[i], dropout_keep(d.seed, d.offset, static_cast<uint64_t>(i), d.p) ? 1.0f / 0.75f : 0.0f) << i;
}
