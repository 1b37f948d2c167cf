// Page-locked staging for a micro-batch's uploads, two blocks used in turn (Note [asynchronous
// uploads] in ops/backend.h): a micro-batch's copy waits only for the copy two micro-batches
// back, so the host never waits for the device between micro-batches.
#pragma once
#include <algorithm>
#include <cstdint>

#include "data/dataset.h"
#include "model/bert.h"
#include "ops/backend.h"

namespace anatomy {

class UploadStaging {
 public:
  // Room for a batch of `batch` x `seq` tokens: ids, token types, mask and labels (I32), a
  // packing index (token rows, and first rows or the B + 1 sequence offsets, I32), and float labels F32 [batch, target_width]
  // (regression, multi-label) or masked-LM token labels I32 [batch, seq] (target_width = seq)
  // after them.
  UploadStaging(Backend& be, int64_t batch, int64_t seq, int64_t target_width = 0)
      : m_be(be), m_targets_at(static_cast<size_t>(4 * batch * seq + 2 * batch + 1)) {
    static_assert(sizeof(float) == sizeof(int32_t));
    const size_t ints = m_targets_at + static_cast<size_t>(batch * target_width);
    for (auto& q : m_p) q = static_cast<int32_t*>(be.host_alloc(ints * sizeof(int32_t)));
  }
  ~UploadStaging() {
    for (auto* q : m_p) m_be.host_free(q);
  }
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  // Copies hb (and pr, when db is packed) into staging block micro % 2 and enqueues its uploads
  // into db (shaped like hb; db.token_rows sized like pr's token rows; db.seq_offsets, when
  // defined, starts where db.first_rows does: the offsets begin with the first rows).
  void upload(const HostBatch& hb, const DeviceBatch& db, int64_t micro, const PackedRows* pr = nullptr) {
    const int slot = static_cast<int>(micro % 2);
    if (m_token[slot] >= 0) m_be.wait_copy(m_token[slot]);
    const int64_t n = hb.batch * hb.seq;
    int32_t* ids = m_p[slot];
    int32_t* types = ids + n;
    int32_t* mask = types + n;
    int32_t* labels = mask + n;
    std::copy(hb.input_ids.begin(), hb.input_ids.end(), ids);
    std::copy(hb.token_type_ids.begin(), hb.token_type_ids.end(), types);
    std::copy(hb.attention_mask.begin(), hb.attention_mask.end(), mask);
    std::copy(hb.labels.begin(), hb.labels.end(), labels);
    m_be.upload_async(db.input_ids, ids);
    m_be.upload_async(db.token_type_ids, types);
    m_be.upload_async(db.attention_mask, mask);
    if (db.packed()) {
      int32_t* rows = labels + hb.batch;
      int32_t* first = rows + pr->token_rows.size();
      std::copy(pr->token_rows.begin(), pr->token_rows.end(), rows);
      m_be.upload_async(db.token_rows, rows);
      std::copy(pr->first_rows.begin(), pr->first_rows.end(), first);
      if (db.seq_offsets.defined()) {  // the first rows, then the count of the sequences' rows
        first[pr->first_rows.size()] = pr->sequence_rows;
        m_be.upload_async(db.seq_offsets, first);
      } else {
        m_be.upload_async(db.first_rows, first);
      }
    }
    if (db.labels.dtype == DType::I32 && db.labels.numel() != static_cast<size_t>(hb.batch)) {  // masked-LM token labels
      int32_t* tokens = m_p[slot] + m_targets_at;
      ANATOMY_CHECK(hb.token_labels.size() >= db.labels.numel(), "internal error: ", hb.token_labels.size(),
                    " token labels for a batch of ", db.labels.numel());
      std::copy_n(hb.token_labels.begin(), db.labels.numel(), tokens);
      m_token[slot] = m_be.upload_async(db.labels, tokens);
    } else if (db.labels.dtype == DType::F32) {  // float labels: the targets, not the class ids
      float* targets = reinterpret_cast<float*>(m_p[slot] + m_targets_at);
      ANATOMY_CHECK(hb.targets.size() >= db.labels.numel(), "internal error: ", hb.targets.size(),
                    " float labels for a batch of ", db.labels.numel(), " (a head of one output reads them as regression)");
      std::copy_n(hb.targets.begin(), db.labels.numel(), targets);
      m_token[slot] = m_be.upload_async(db.labels, targets);
    } else {
      m_token[slot] = m_be.upload_async(db.labels, labels);
    }
  }

 private:
  Backend& m_be;
  size_t m_targets_at;  // elements
  int32_t* m_p[2];
  int m_token[2] = {-1, -1};
};

}  // namespace anatomy
