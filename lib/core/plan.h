// How one fused-attention call is cut into tasks, and where each task keeps its working state.
// Target-independent: the driver (api/attention.cpp) makes the plan, every provider's flash
// kernel (kernels/flash/) runs its tasks, and the split-key merge (core/split_merge.cpp)
// combines their partial results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/inline.h"
#include "core/problem.h"

namespace cpuattn::detail {

// Derived from the shape and the kernel's block sizes only, never from the thread count, so that
// results are bitwise identical for any number of threads.
// At most this many query rows of one K/V head in a block take the kernel's streaming (decode)
// path when K/V are not reused across query blocks.
inline constexpr std::int64_t kStreamRows = 8;

struct Plan {
  std::int64_t rows = 0;         // query rows per block (positions x heads)
  std::int64_t heads_per_block;  // nh: query heads of one K/V group folded into a block
  // K/V heads of one task; above 1 only for paged decoding (see make_plan): the block's rows are
  // then those heads' groups of query heads, head-major, at one query position.
  std::int64_t kv_heads_per_task = 1;
  std::int64_t pos_per_block;     // np: query positions per block
  std::int64_t head_splits;       // ceil(group / nh): blocks across one group's heads
  std::int64_t q_blocks;          // ceil(Lq / np)
  std::int64_t q_chunks;          // tasks per (b, kv head, head split) along the queries
  std::int64_t blocks_per_chunk;  // q blocks per chunk
  std::int64_t k_splits;          // tasks along the keys (merged afterwards); 1 = no split
  std::int64_t keys_per_split;    // multiple of the kernel's key block
  std::int64_t tasks;  // B * ceil(Hkv / kv_heads_per_task) * head_splits * q_chunks * k_splits

  // A task's partial results when k_splits > 1: for each of its rows, (m, l, acc[Dv]) with acc
  // unnormalized and m in log2 units; indexed [unit][split][row], unit = one q block.
  float* partials = nullptr;
  std::int64_t partial_row_floats = 0;  // Dv + 2

  // Write the output rows with non-temporal stores (where a row is whole aligned vectors).
  bool stream_out = false;
};

// The plan for `p` on a kernel with these block sizes (see simd/tiles.h).
Plan make_plan(const Problem& p, std::int64_t block_rows, std::int64_t block_keys);

// Combines the k_splits partial results of each row in a fixed order (split 0, 1, ...) into out
// and lse. Runs on the caller's task arena; with a recorder, its tasks are timed as the merge.
class Recorder;
void merge_partials(const Problem& p, const Plan& pl, Recorder* rec = nullptr);

// Layout of one task's scratch, in floats from a 64-byte aligned base. Every array starts on a
// 64-byte boundary, so the kernels' aligned vector loads hold whatever the row count.
struct TaskScratch {
  std::size_t qp, qp_stride, s, pb, acc, m, l, rm, kv, total;
  CPUATTN_ALWAYS_INLINE TaskScratch(const Problem& p, const Plan& pl, std::int64_t task_keys,
                                    std::int64_t block_keys, std::int64_t dv_padded,
                                    bool keep_packed, bool native_q = false) {
    const auto rows = static_cast<std::size_t>(pl.rows);
    // Each array starts at `total` and rounds it up to 16 floats (64 bytes).
    total = 0;
    // Qp is [rows][D] f32, D padded to 16; in the native bf16 unit (native_q) each row is followed
    // by its hi and lo bf16 copies (2 x D rounded up to 32 bf16: SplitQRows, decode-inl.h). Only
    // there: the wider rows cost S1 and X1 (f32, D 64) about 2% in the f32 units.
    qp_stride = (static_cast<std::size_t>(p.D) + 15) / 16 * 16 +
                (native_q ? (static_cast<std::size_t>(p.D) + 31) / 32 * 32 : 0);
    qp = take(rows * qp_stride);
    s = take(rows * block_keys);
    pb = take(rows * block_keys / 2);  // the native bf16 kernel's P in bf16 (bf16-inl.h)
    acc = take(rows * dv_padded);
    m = take(rows);
    l = take(rows * 16);  // a vector of partial sums per row (<= 16 f32 lanes)
    rm = take(rows * 8);  // one RowMask (<= 32 bytes) per row
    const std::int64_t blocks = keep_packed ? (task_keys + block_keys - 1) / block_keys : 1;
    kv = take(static_cast<std::size_t>(blocks * block_keys * (p.D + dv_padded)));
  }

 private:
  CPUATTN_ALWAYS_INLINE std::size_t take(std::size_t floats) {
    const std::size_t start = total;
    total += (floats + 15) / 16 * 16;
    return start;
  }
};

// Where task split `ks` leaves its (m, l, acc[Dv]) for query row (b, h, i).
CPUATTN_ALWAYS_INLINE float* partial_row(const Problem& p, const Plan& pl, std::int64_t b,
                                         std::int64_t h, std::int64_t i, std::int64_t ks) {
  const std::int64_t row = (b * p.H + h) * p.Lq + i;
  return pl.partials + (row * pl.k_splits + ks) * pl.partial_row_floats;
}

}  // namespace cpuattn::detail
