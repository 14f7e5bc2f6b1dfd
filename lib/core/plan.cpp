#include "core/plan.h"

#include <algorithm>
#include <cstdint>
#include <thread>

namespace cpuattn::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Enough tasks to balance this machine's cores (4 per hardware thread, at least 16). It depends on
// the machine, never on the thread count of a call, so results do not change with it.
std::int64_t target_tasks() {
  static const std::int64_t n = std::max<std::int64_t>(
      16, 4 * static_cast<std::int64_t>(std::thread::hardware_concurrency()));
  return n;
}

// Keys below which splitting the key range is not worth a merge.
constexpr std::int64_t kMinKeysPerSplit = 512;

// Outputs larger than this are written with non-temporal stores. An output 4x the 2 MiB L2 of a
// core cannot stay in L2 for whatever reads it next, and a plain store first reads each line
// for ownership: S1's 12.6 MB output costs 5% of its time that way (measured: 169-172 ->
// 179-181 GFLOP/s). Smaller outputs keep plain stores, so a consumer finds them in cache.
constexpr std::int64_t kStreamOutBytes = std::int64_t{8} << 20;

}  // namespace

Plan make_plan(const Problem& p, std::int64_t block_rows, std::int64_t block_keys) {
  Plan pl;
  pl.heads_per_block = std::min(p.group, block_rows);
  pl.pos_per_block = std::max<std::int64_t>(1, block_rows / pl.heads_per_block);
  pl.rows = pl.heads_per_block * pl.pos_per_block;
  pl.head_splits = ceil_div(p.group, pl.heads_per_block);
  pl.q_blocks = ceil_div(p.Lq, pl.pos_per_block);
  // Paged decoding: a task takes every K/V head of its sequence (up to 64 rows) and, block by
  // block, runs them head after head through the same pages (kernels/flash/task-inl.h). Head by
  // head across tasks, a 16-token page is Hkv separate 8 KiB runs (f32, D = 128) read at
  // different times, each of which the hardware prefetchers must find anew; within one task a
  // page's [Hkv, P, D] is read front to back over a block. Zen 4, one core, G1 (pages of 16):
  // 0.78x -> 0.86-0.91x of contiguous decoding (a read test of the two patterns: 16 against
  // 20-21 GB/s). Each head's rows must fit the streaming path.
  if (p.pages != nullptr && p.Lq == 1 && p.group <= kStreamRows && p.Hkv > 1) {
    pl.kv_heads_per_task = std::min(p.Hkv, std::max<std::int64_t>(1, 64 / p.group));
    pl.heads_per_block = p.group;
    pl.pos_per_block = 1;
    pl.head_splits = 1;
    pl.q_blocks = 1;
    pl.rows = pl.kv_heads_per_task * p.group;
  }
  const std::int64_t units = p.B * ceil_div(p.Hkv, pl.kv_heads_per_task) * pl.head_splits;
  // Few tasks per head keep K/V packing amortized over many query blocks; more only to balance.
  const std::int64_t want_chunks =
      std::clamp(ceil_div(target_tasks(), units), std::int64_t{1}, pl.q_blocks);
  pl.blocks_per_chunk = ceil_div(pl.q_blocks, want_chunks);
  pl.q_chunks = ceil_div(pl.q_blocks, pl.blocks_per_chunk);
  // Short query ranges (decoding) leave too few tasks: split the keys and merge afterwards.
  std::int64_t splits = 1;
  if (units * pl.q_chunks < target_tasks()) {
    splits =
        std::min(ceil_div(target_tasks(), units * pl.q_chunks), ceil_div(p.Lk, kMinKeysPerSplit));
    splits = std::max<std::int64_t>(splits, 1);
  }
  pl.keys_per_split = ceil_div(ceil_div(p.Lk, splits), block_keys) * block_keys;
  pl.k_splits = ceil_div(p.Lk, pl.keys_per_split);
  pl.tasks = units * pl.q_chunks * pl.k_splits;
  pl.partial_row_floats = p.Dv + 2;
  pl.stream_out = pl.k_splits == 1 && p.out_dtype == DType::f32 &&
                  p.B * p.H * p.Lq * p.Dv * 4 > kStreamOutBytes;
  return pl;
}

}  // namespace cpuattn::detail
