// The flash op's one decision: how a problem is cut into tasks and which units run each query
// block (XNNPACK's src/configs/: choose once per operator, run without choosing). plan_flash()
// makes it from the problem, the call's target and the dtypes and stores it in the Plan; the task
// driver (driver-inl.h), the profile records (CPUATTN_VERBOSE path=...) and the tests read the
// Plan, and nothing else derives the choice again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/inline.h"
#include "core/problem.h"
#include "core/softmax.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

struct Choice;

// At most this many query rows of one K/V head in a block stream K/V in place (the decode
// units) when the task does not reuse its K/V blocks across query blocks; more rows pack them.
inline constexpr std::int64_t kStreamRows = 8;

// The most runs after a block's (ScoreUnit::dot_runs) whose K rows its lock-step prefetches
// (BlockPath::runs_ahead): a block of 128 keys in pages of 16 has 8 runs, so 8 cover all the
// keys of the next head's or block's.
inline constexpr int kMaxRunsAhead = 8;

// Which compiled task function runs the problem: the portable one of the call's provider and
// target, or a native unit (flash_bf16.cc: AVX-512 with AVX512-BF16 and VNNI; flash_vnni.cc:
// AVX-512 with VNNI, its int8 P V only).
enum class FlashUnit : std::uint8_t { portable, avx512_bf16, avx512_vnni };
// What a compiled unit runs besides the portable units: the bf16 products (tiles, streams, AMX)
// and the VNNI P V of int8 decoding (driver-inl.h discards the branches of what it lacks).
constexpr bool has_bf16_units(FlashUnit u) { return u == FlashUnit::avx512_bf16; }
constexpr bool has_vnni_units(FlashUnit u) { return u != FlashUnit::portable; }

// A query block is one of three kinds, by its rows per K/V head and whether its task keeps K/V
// packed for several query blocks (block_kind()); each kind has its own units (BlockPath).
enum class BlockKind : std::uint8_t { tiled, stream_one, stream_few };
inline constexpr int kBlockKinds = 3;

// The units of one query block; each unit's file states its contract (docs/architecture.md
// lists them):
//   QUnit      f32       Q rows scaled by scale * log2 e (q_pack-inl.h)
//              bf16      Q rows copied as bf16 pairs (x86/bf16_tile-inl.h)
//              f32_hilo  f32 rows plus each row split into bf16 hi + lo (x86/bf16_stream-inl.h)
//              f32_in_place  f32 Q rows read where they are by the f32 tiles, K's panels
//                        packed times scale * log2 e instead (plan_flash: one query head per
//                        block, f32 Q, scale * log2 e <= 1)
//   KvUnit     packed_f32   K panels and V chunks in f32 (kv_pack-inl.h)
//              packed_bf16  K panels and V chunks as bf16 pairs (x86/bf16_tile-inl.h)
//              in_place     K and V read where they are (streamed blocks)
//              v_packed     K in place, V packed per block and head (Dv not whole vectors)
//              k_packed     K panels in f32; f32 V read in place by the P V tile (a block
//                           in one page)
//   ScoreUnit  tile_f32, tile_bf16   a tile of rows against a packed K panel
//              tile_amx  bf16 K panels on AMX tiles, raw scores into S (x86/amx_tile-inl.h)
//              dot       streamed K, one stream per block (stream_dot-inl.h)
//              dot_runs  streamed K in four interleaved runs (stream_runs-inl.h)
//   PvUnit     tile_f32, tile_bf16   rows of P times packed V chunks
//              tile_amx    bf16 P times bf16 V chunks on AMX tiles (x86/amx_tile-inl.h)
//              runs        V in place, widened as loaded (pv-inl.h)
//              runs_bf16   V in place on vdpbf16ps (x86/bf16_stream-inl.h)
//              runs_vnni   int8 V in place on vpdpwssd (x86/vnni_i8-inl.h)
enum class QUnit : std::uint8_t { f32, bf16, f32_hilo, f32_in_place };
enum class KvUnit : std::uint8_t { packed_f32, packed_bf16, in_place, v_packed, k_packed };

// scale * log2 e in f32: the factor Q (or, with QUnit::f32_in_place, K) is multiplied by so that
// the scores come out in log2 units and the softmax runs on exp2.
inline float log2_scale(const Problem& p) { return static_cast<float>(p.scale) * kLog2e; }

// The units that pack K per block (into the task's scratch, two blocks after asking for them).
inline bool packs_k(KvUnit u) {
  return u == KvUnit::packed_f32 || u == KvUnit::packed_bf16 || u == KvUnit::k_packed;
}

enum class ScoreUnit : std::uint8_t { tile_f32, tile_bf16, dot, dot_runs, tile_amx };
enum class PvUnit : std::uint8_t { tile_f32, tile_bf16, runs, runs_bf16, runs_vnni, tile_amx };

struct BlockPath {
  QUnit q;
  KvUnit kv;
  ScoreUnit score;
  PvUnit pv;
  // Streamed contiguous K/V whose scores prefetch V: the P V unit prefetches the next block's K
  // rows (key_ahead.h).
  bool k_ahead = false;
  // The streamed scores prefetch K rows ahead of their own, with k_ahead also where P V asked for
  // them already, except 2-byte K on AMD's Zen 3 and Zen 4 (Choice::narrow_k_once; the path
  // names it "+k_once"). `cpuattn bench --tweak no_scores_k_ahead` / `scores_k_ahead` time either
  // against the plan (a CPU-dependent trade: docs/performance.md#dm-scores-k-ahead).
  bool scores_k_ahead = true;
  // Streamed K in place that reads in runs (ScoreUnit::dot_runs) by Intel's rule where other
  // CPUs split the streams (k_ahead; config.cpp, choose_block). `cpuattn bench --tweak
  // key_stream` times the split, `key_runs` the runs on any CPU.
  bool k_ahead_declined = false;
  // The streamed scores (ScoreUnit::dot) ask for V rows into L2 (prefetcht2) rather than L1
  // (detail::ScoresAhead): Intel, V of 2- and 4-byte elements (config.cpp, choose_block). Kept
  // for a block that declined k_ahead (its one stream under key_stream), in effect only on dot.
  // `cpuattn bench --tweak v_ahead_l1` / `v_ahead_l2` times either on any CPU.
  bool v_ahead_l2 = false;
  // ScoreUnit::dot_runs: how many of the runs read next (the next head's or block's) have their K
  // rows prefetched row by row beside the block's own, at most kMaxRunsAhead. Fewer where every
  // prefetch hint fills L1 and the lock-step would ask for more lines than such a core keeps in
  // flight (config.cpp, runs_ahead_within). `cpuattn bench --tweak runs_ahead_max` /
  // `no_runs_ahead` times kMaxRunsAhead / none on any CPU.
  int runs_ahead = kMaxRunsAhead;
  // The P V tiles of a query block's last key block write its rows' outputs (PvOut,
  // pv-inl.h), and the output epilogue only their lse: f32 tiles (PvUnit::tile_f32) with out f32
  // or f32_stream and Dv whole vectors. The exact rerun (non-finite Acc) writes through the
  // epilogue.
  bool out_in_pv = false;
  // Tiled f32 V whose rows the P V tile could read in place (KvUnit::k_packed) but which the plan
  // packs, since a column chunk of its rows would not fit L1d's sets (config.cpp,
  // v_chunk_fits_l1). `cpuattn bench --tweak v_in_place` times reading it in place.
  bool v_in_place_declined = false;
  // Tiled blocks: K/V packed into panels and chunks, scores in tiles of rows.
  CPUATTN_ALWAYS_INLINE bool tiled() const {
    return score == ScoreUnit::tile_f32 || score == ScoreUnit::tile_bf16 ||
           score == ScoreUnit::tile_amx;
  }
  // The accumulators are in the column order of the native P V runs until the output
  // (x86/pair_order-inl.h).
  CPUATTN_ALWAYS_INLINE bool permuted() const {
    return pv == PvUnit::runs_bf16 || pv == PvUnit::runs_vnni;
  }
};

// How rows leave a task: normalised into out (f32, f32 with non-temporal stores where a row is
// whole aligned vectors, or converted to bf16/f16), or unnormalised into the split-key partials.
enum class OutUnit : std::uint8_t { f32, f32_stream, narrow, partials };

struct FlashPath {
  FlashUnit unit = FlashUnit::portable;
  BlockPath block[kBlockKinds];
  OutUnit out = OutUnit::f32;
  std::uint8_t kinds = 0;  // bit k: some query block of the problem is of kind k
  bool q_hilo = false;     // some block of the problem uses QUnit::f32_hilo
  // Every task runs keys as the tiles' rows (keys_rows-inl.h; config.cpp, keys_as_rows_fits),
  // falling back to the blocks' units for a task whose sums are not finite.
  bool keys_as_rows = false;
};

// The kind of a query block of `head_rows` rows per K/V head; `kv_reused`: its task keeps its
// K/V blocks packed for several query blocks.
CPUATTN_ALWAYS_INLINE BlockKind block_kind(std::int64_t head_rows, bool kv_reused) {
  if (kv_reused || head_rows > kStreamRows) return BlockKind::tiled;
  return head_rows == 1 ? BlockKind::stream_one : BlockKind::stream_few;
}

struct Plan {
  std::int64_t rows = 0;         // query rows per block (positions x heads)
  std::int64_t heads_per_block;  // nh: query heads of one K/V group folded into a block
  // K/V heads of one task; above 1 only for paged decoding (plan_tasks): the block's rows are
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
  std::int64_t ahead_kv_bytes = 0;  // of the next task's K/V prefetched by a tiled task

  // A task's partial results when k_splits > 1: for each of its rows, (m, l, acc[Dv]) with acc
  // unnormalized and m in log2 units; indexed [row][split], row = (b * H + h) * Lq + i.
  float* partials = nullptr;
  std::int64_t partial_row_floats = 0;  // Dv + 2

  FlashPath path;
};

// The plan of `p` for the call's choice: tasks from the shape and the kernel's block sizes
// (never from the thread count, so results are bitwise identical for any number of threads),
// and the units of every kind of query block. `share`: p's fraction of the work of the set of
// problems its call runs as one (the sequences of a paged or packed batch; 1 alone), which
// takes that fraction of the tasks the machine wants before key or query splits are added.
Plan plan_flash(const Problem& p, const Choice& choice, double share = 1.0);

// Whether the tiled blocks of bf16 Q and K/V of head size D run on AMX (Choice::amx_bf16, D
// whole 32s: a tile step takes 32 dims).
bool amx_tiles(const Choice& choice, DType q, DType kv, std::int64_t D);

// The unit a problem with these dtypes runs for a choice, `rows` its query rows per K/V head
// (Lq x group), D its head size. Public so that active_bf16_path() reports this very rule.
FlashUnit choose_unit(const Choice& choice, DType q, DType kv, std::int64_t rows, std::int64_t D);

// The path as CPUATTN_VERBOSE prints it, e.g. "portable:tiled=tile_f32+tile_f32/f32" or
// "avx512_bf16:stream_few=dot_runs_hilo+runs_bf16/partials".
std::string path_name(const FlashPath& path);

// Layout of one task's scratch, in floats from a 64-byte aligned base. Every array starts on a
// 64-byte boundary, so the kernels' aligned vector loads hold whatever the row count.
//   Qp  [rows][qp_stride]  the block's query rows (QUnit): f32, D padded to 16; with f32_hilo
//                          each row is followed by its hi and lo bf16 copies (2 x D rounded up
//                          to 32 bf16); QUnit::bf16 keeps bf16 pairs in the same space
//   S   [rows][Nk]         the scores of one (query block, key block) pair, then the weights
//   Pb  [rows][Nk] x 16 b  the weights rounded to bf16 (or int16) for the native P V units
//   Acc [rows][DvP]        the unnormalised output, DvP = Dv rounded up to a vector
//   m, l                   the running max and a vector of partial sums (<= 16 lanes) per row
//   rm                     one RowMask (<= 32 bytes) per row
//   KV                     packed K/V blocks: all of the task's when it keeps them, else one
struct TaskScratch {
  std::size_t qp, qp_stride, s, pb, acc, m, l, rm, out_rows, out_scale, kv, total;
  CPUATTN_ALWAYS_INLINE TaskScratch(const Problem& p, const Plan& pl, std::int64_t task_keys,
                                    std::int64_t block_keys, std::int64_t dv_padded,
                                    bool keep_packed) {
    const auto rows = static_cast<std::size_t>(pl.rows);
    total = 0;
    qp_stride = (static_cast<std::size_t>(p.D) + 15) / 16 * 16 +
                (pl.path.q_hilo ? (static_cast<std::size_t>(p.D) + 31) / 32 * 32 : 0);
    qp = take(rows * qp_stride);
    s = take(rows * block_keys);
    pb = take(rows * block_keys / 2);
    acc = take(rows * dv_padded);
    m = take(rows);
    l = take(rows * 16);
    rm = take(rows * 8);
    constexpr std::size_t kPointerBytes = sizeof(float*), kFloatBytes = sizeof(float);
    static_assert(kPointerBytes % kFloatBytes == 0);
    out_rows = take(rows * (kPointerBytes / kFloatBytes));
    out_scale = take(rows);
    const std::int64_t blocks = keep_packed ? (task_keys + block_keys - 1) / block_keys : 1;
    kv = take(static_cast<std::size_t>(blocks * block_keys * (p.D + dv_padded)));
  }

 private:
  // Takes `floats` from `total`, rounded up to 16 floats (64 bytes).
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
