// The task driver of the fused flash-attention kernel: decodes task t of the plan, walks its
// query blocks and, for each, its key blocks, and calls the units the plan chose for the block's
// kind (config.h): Q packing, K/V loading, scores (+ masks), online softmax, P V, and the output
// epilogue. It decides nothing about which unit runs: that is plan_flash's. Written once against
// the vector contract (simd/contract.h) for any provider `O`; kUnit: the unit being compiled
// (FlashUnit): the native ones (flash_bf16.cc, flash_vnni.cc) compile the native units (x86/) they
// have (has_bf16_units, has_vnni_units), and every branch to the others is discarded.
#if defined(CPUATTN_KERNELS_FLASH_DRIVER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_DRIVER_INL_H_
#undef CPUATTN_KERNELS_FLASH_DRIVER_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_DRIVER_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/recorder.h"
#include "core/scratch.h"
#include "core/softmax.h"
#include "kernels/common/mask-inl.h"
#include "kernels/flash/config.h"
#include "kernels/flash/epilogue-inl.h"
#include "kernels/flash/fp8_lo-inl.h"
#include "kernels/flash/geometry-inl.h"
#include "kernels/flash/keys_rows-inl.h"
#include "kernels/flash/kv_pack-inl.h"
#include "kernels/flash/pv-inl.h"
#include "kernels/flash/pv_skip_zero-inl.h"
#include "kernels/flash/q_pack-inl.h"
#include "kernels/flash/score_tile-inl.h"
#include "kernels/flash/softmax-inl.h"
#include "kernels/flash/stream_dot-inl.h"
#include "kernels/flash/stream_runs-inl.h"
#include "simd/contract.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// The native units (x86/), defined only in the native units that have them.
template <class O>
struct Bf16Tile;
template <class O>
struct Bf16Stream;
template <class O>
struct VnniI8;
template <class O>
struct Bf16Amx;
template <class O>
struct PairOrder;

// What task t covers: batch b, K/V heads [hk, hk + nhk), query heads [h0, h0 + nh) (with several
// K/V heads, their groups head-major), query blocks [qb0, qb1), keys [k0, k1) of split ks.
struct TaskCoords {
  std::int64_t b, hk, nhk, h0, nh, qb0, qb1, k0, k1, ks;
  bool keep_packed;  // several query blocks: each K/V block is packed once and kept
};

CPUATTN_ALWAYS_INLINE TaskCoords DecodeTask(const detail::Problem& p, const detail::Plan& pl,
                                            std::int64_t t) {
  TaskCoords c;
  c.ks = t % pl.k_splits;
  t /= pl.k_splits;
  const std::int64_t qc = t % pl.q_chunks;
  t /= pl.q_chunks;
  const std::int64_t hs = t % pl.head_splits;
  t /= pl.head_splits;
  const std::int64_t kv_tasks = (p.Hkv + pl.kv_heads_per_task - 1) / pl.kv_heads_per_task;
  c.hk = t % kv_tasks * pl.kv_heads_per_task;
  c.b = t / kv_tasks;
  c.nhk = std::min(pl.kv_heads_per_task, p.Hkv - c.hk);
  c.nh =
      c.nhk > 1 ? c.nhk * p.group : std::min(pl.heads_per_block, p.group - hs * pl.heads_per_block);
  c.h0 = c.hk * p.group + hs * pl.heads_per_block;
  c.qb0 = qc * pl.blocks_per_chunk;
  c.qb1 = std::min(pl.q_blocks, c.qb0 + pl.blocks_per_chunk);
  c.k0 = c.ks * pl.keys_per_split;
  c.k1 = std::min(p.Lk, c.k0 + pl.keys_per_split);
  c.keep_packed = c.qb1 - c.qb0 > 1;
  return c;
}

// The inputs a task reads next, prefetched into L2 while the query block just packed is
// computed (tiled blocks only: streamed blocks prefetch their own rows): the next query block's Q
// rows, or from the last block the next task's first Q rows; and the next task's K/V rows, up to
// Plan::ahead_kv_bytes. Without them a short task (S1: one 128-key block per head; X1: 1024 keys
// that the first of four query blocks reads) starts its reads from memory cold. The tiles ask
// for them evenly through the block: `per_tile` lines after each tile (Drip), Q rows first (read
// first), then K/V key after key, so that all are asked for by the block's last tile and no more
// are in flight at once than a tile's time covers. A share at a time filled the core's miss queue
// and stalled the tiles for as long as it saved (docs/performance.md#dm-kv-drip); a fixed 8 lines
// per tile left most of S1's lines to one burst at the block's end (#dm-drip-even). Other units
// ask in `shares` parts, one after each key block's scores and P V (Next), what the tiles
// have not.
struct InputsAhead {
  std::int64_t b = 0, h0 = 0, nh = 0, pos0 = 0, rows = 0;  // Q rows (PrefetchQ)
  std::int64_t b_kv = 0, hk = 0, kb = 0, nk = 0;           // K/V keys [kb, kb + nk) of head hk
  std::int64_t lines = 0, per_tile = 0, shares = 0;        // lines in all, per tile; parts
  std::int64_t asked = 0, issued = 0;                      // lines asked so far; parts done
  std::int64_t q_next = 0, kv_next = 0, kv_off = 0;  // next Q row; next key, bytes of it asked

  void Next(const detail::Problem& p) {
    if (issued >= shares) return;
    ++issued;
    Ask(p, lines * issued / shares - asked);
  }
  CPUATTN_ALWAYS_INLINE void Drip(const detail::Problem& p) {
    if (asked < lines) Ask(p, per_tile);
  }
  void Rest(const detail::Problem& p) { Ask(p, lines - asked); }

  // Up to n more lines: Q rows (whole rows), then the K/V rows (K row, then V row).
  void Ask(const detail::Problem& p, std::int64_t n) {
    if (n <= 0) return;
    const std::int64_t q_lines = QRowLines(p), n0 = n;
    if (q_next < rows) {
      const std::int64_t q_end = std::min(rows, q_next + (n + q_lines - 1) / q_lines);
      PrefetchQ(p, b, h0, nh, pos0, q_next, q_end);
      n -= (q_end - q_next) * q_lines;
      q_next = q_end;
    }
    const auto ek = static_cast<std::int64_t>(dtype_size(p.k.dtype));
    const auto ev = static_cast<std::int64_t>(dtype_size(p.v.dtype));
    const std::int64_t kbytes = p.D * ek, bytes = KvRowBytes(p);
    while (n > 0 && kv_next < nk) {
      const std::int64_t j = kb + kv_next;
      const char* krow =
          static_cast<const char*>(p.k.data) + (p.key_off(p.k.s, b_kv, j) + hk * p.k.s[1]) * ek;
      const char* vrow =
          static_cast<const char*>(p.v.data) + (p.key_off(p.v.s, b_kv, j) + hk * p.v.s[1]) * ev;
      for (; n > 0 && kv_off < bytes; kv_off += 64, --n)
        detail::Prefetch<2>(kv_off < kbytes ? krow + kv_off : vrow + (kv_off - kbytes));
      if (kv_off >= bytes) {
        ++kv_next;
        kv_off = 0;
      }
    }
    asked += n0 - n;  // exact: whole Q rows may overshoot n
  }
  static std::int64_t QRowLines(const detail::Problem& p) {
    return (p.D * static_cast<std::int64_t>(dtype_size(p.q.dtype)) + 63) / 64;
  }
  static std::int64_t KvRowBytes(const detail::Problem& p) {  // a key's K row and V row
    return p.D * static_cast<std::int64_t>(dtype_size(p.k.dtype)) +
           p.Dv * static_cast<std::int64_t>(dtype_size(p.v.dtype));
  }
  static std::int64_t KvRowLines(const detail::Problem& p) { return (KvRowBytes(p) + 63) / 64; }
};

// The task's arrays in its scratch (TaskScratch, config.h).
struct TaskBuffers {
  float* qp;
  std::int64_t qs;  // Qp row stride
  float *s, *acc, *m, *l, *kv;
  RowMask* rm;
  float** out_rows;  // BlockPath::out_in_pv: each row's out row and scale (PvOut)
  float* out_scale;
  std::uint16_t* pb;
  std::int64_t packed_blocks = 0;  // with keep_packed: K/V blocks [0, packed_blocks) are ready
  InputsAhead ahead;               // what the task reads next (RunTask)
};

template <class O>
CPUATTN_ALWAYS_INLINE TaskBuffers LayOutTask(const detail::Problem& p, const detail::Plan& pl,
                                             const TaskCoords& tc, const Geometry<O>& g,
                                             detail::Scratch& scratch) {
  const detail::TaskScratch ts(p, pl, tc.k1 - tc.k0, g.Nk, g.DvP, tc.keep_packed);
  float* base = scratch.get(ts.total);
  static_assert(sizeof(RowMask) <= 8 * sizeof(float) && alignof(RowMask) <= 64);
  TaskBuffers tb;
  tb.qp = base + ts.qp;
  tb.qs = static_cast<std::int64_t>(ts.qp_stride);
  tb.s = base + ts.s;
  tb.acc = base + ts.acc;
  tb.m = base + ts.m;
  tb.l = base + ts.l;
  tb.kv = base + ts.kv;
  tb.rm = reinterpret_cast<RowMask*>(base + ts.rm);
  tb.out_rows = reinterpret_cast<float**>(base + ts.out_rows);
  tb.out_scale = base + ts.out_scale;
  tb.pb = reinterpret_cast<std::uint16_t*>(base + ts.pb);
  return tb;
}

// A query block: positions [pos0, pos1) x the task's nh heads, `rows` rows (head_rows per K/V
// head), the units of its kind, and the keys its rows may see because of causality, key lengths
// and the window: row r sees [begin(r), end(r)), both non-decreasing in r, so key blocks before
// kb_first are skipped whole, blocks from end_hi on are never read, and keys below end_lo and
// from begin_hi on are seen by every row.
struct QueryBlock {
  std::int64_t pos0, pos1;
  int rows, head_rows;
  std::int64_t end_lo, end_hi, begin_hi, kb_first;
  detail::BlockPath path;
  bool k_lo = false;  // Qp times 2^120, K read as Fp8E4M3Lo (fp8_lo-inl.h)
  // The f32 rows the score units read (QUnit::f32, f32_hilo: Qp; f32_in_place: Q's own rows),
  // row r at qrows + r * qs.
  const float* qrows = nullptr;
  std::int64_t qs = 0;
};

template <class O>
CPUATTN_ALWAYS_INLINE QueryBlock QueryBlockOf(const detail::Problem& p, const detail::Plan& pl,
                                              const TaskCoords& tc, const Geometry<O>& g,
                                              std::int64_t qb) {
  QueryBlock q;
  q.pos0 = qb * pl.pos_per_block;
  q.pos1 = std::min(p.Lq, q.pos0 + pl.pos_per_block);
  q.rows = static_cast<int>((q.pos1 - q.pos0) * tc.nh);
  q.head_rows = q.rows / static_cast<int>(tc.nhk);
  q.path = pl.path.block[static_cast<int>(detail::block_kind(q.head_rows, tc.keep_packed))];
  q.end_lo = std::min(tc.k1, p.key_end(tc.b, q.pos0));
  q.end_hi = std::min(tc.k1, p.key_end(tc.b, q.pos1 - 1));
  const std::int64_t begin_lo = std::clamp(p.key_begin(q.pos0), tc.k0, tc.k1);
  q.begin_hi = std::clamp(p.key_begin(q.pos1 - 1), tc.k0, tc.k1);
  q.kb_first = tc.k0 + (begin_lo - tc.k0) / g.Nk * g.Nk;
  return q;
}

// QUnit: the block's query rows into Qp, or where the tiles read them in place (one head per
// block: row r is position pos0 + r); sets q.qrows and q.qs, and q.k_lo where the rows were
// multiplied by 2^120 for an fp8 K read as Fp8E4M3Lo.
template <class O, detail::FlashUnit kUnit>
CPUATTN_ALWAYS_INLINE void PackQueries(const detail::Problem& p, const TaskCoords& tc,
                                       QueryBlock& q, const TaskBuffers& tb) {
  q.qrows = tb.qp;
  q.qs = tb.qs;
  q.k_lo = false;
  if (q.path.q == detail::QUnit::f32_in_place) {
    q.qrows = static_cast<const float*>(p.q.data) + tc.b * p.q.s[0] + tc.h0 * p.q.s[1] +
              q.pos0 * p.q.s[2];
    q.qs = p.q.s[2];
    return;
  }
  if (q.path.q == detail::QUnit::bf16) {
    if constexpr (detail::has_bf16_units(kUnit))
      Bf16Tile<O>::PackQ(p, tc.b, tc.h0, tc.nh, q.pos0, q.rows, (p.D + 1) / 2,
                         reinterpret_cast<std::uint16_t*>(tb.qp));
    return;
  }
  const float qscale = detail::log2_scale(p);
  PackQ<O>(p, tc.b, tc.h0, tc.nh, q.pos0, q.rows, qscale, tb.qs, tb.qp);
  if constexpr (detail::has_bf16_units(kUnit)) {
    if (q.path.q == detail::QUnit::f32_hilo) Bf16Stream<O>::SplitQRows(tb.qp, q.rows, tb.qs, p.D);
  }
  q.k_lo = PrescaleQForFp8K<O>(p, q.path, tb.qp, q.rows, tb.qs);
}

// The variants every score of a call goes through (soft-cap, ALiBi) and its mask kind.
inline MaskInfo MaskInfoOf(const detail::Problem& p) {
  MaskInfo mi{p.mask_kind, p.mask.s[3]};
  if (p.softcap != 0) {
    mi.softcap = true;
    mi.cap = static_cast<float>(p.softcap * detail::kLog2e);
    mi.k = static_cast<float>(2.0 / p.softcap);  // 2 log2(e) / (softcap log2(e))
  }
  mi.alibi = p.has_alibi();
  return mi;
}

// Row r of a block is (position pos0 + r / nh, head h0 + r % nh): nested loops avoid a 64-bit
// division per row and block.
CPUATTN_ALWAYS_INLINE void SetRowSlopes(const detail::Problem& p, const TaskCoords& tc,
                                        const QueryBlock& q, const MaskInfo& mi, RowMask* rm) {
  for (std::int64_t i = q.pos0, r = 0; i < q.pos1; ++i)
    for (std::int64_t h = tc.h0; h < tc.h0 + tc.nh; ++h, ++r)
      rm[r].slope = mi.alibi ? static_cast<float>(p.alibi_slope(tc.b, h) * detail::kLog2e) : 0.0f;
}

// A key block: keys [kb0, kb0 + nk) of the task, the first nk_live of which some row may see
// (ncols: rounded up to whole score panels); columns [clean_lo, clean_hi) need no per-element
// mask for any row; kp/vp: its packed K/V (packed units).
struct KeyBlock {
  std::int64_t kb0, nk, nk_live, ncols, clean_lo, clean_hi;
  float *kp, *vp;
  // No panel of the block needs a per-element mask for any row.
  bool clean() const { return clean_lo == 0 && clean_hi >= ncols; }
};

// KvUnit: the block's geometry, and for the packed units the block packed (once per task when
// the task keeps them) after asking for the rows two blocks ahead, so that their misses overlap
// this block's work. Streamed blocks prefetch their own rows as they read them (stream_dot-inl.h).
// The K/V rows of the key block two after the one at kb0 (with `first`, also of the next one),
// into L2, as far as the task's keys go, except keys below `asked_to`, which the task before
// asked for already (KeysAskedAhead).
CPUATTN_ALWAYS_INLINE void PrefetchBlocksAhead(const detail::Problem& p, const TaskCoords& tc,
                                               std::int64_t kb0, bool first, std::int64_t nk,
                                               std::int64_t asked_to) {
  const auto ask = [&](std::int64_t j0) {
    const std::int64_t lo = std::max(j0, asked_to), hi = std::min(j0 + nk, tc.k1);
    if (lo < hi) PrefetchKV(p, tc.b, tc.hk, lo, hi - lo);
  };
  if (first) ask(kb0 + nk);
  ask(kb0 + 2 * nk);
}

template <class O, detail::FlashUnit kUnit>
KeyBlock LoadKeyBlock(const detail::Problem& p, const TaskCoords& tc, const QueryBlock& q,
                      const Geometry<O>& g, std::int64_t kb0, TaskBuffers& tb) {
  KeyBlock kb;
  kb.kb0 = kb0;
  kb.nk = std::min(g.Nk, tc.k1 - kb0);
  const std::int64_t slot = tc.keep_packed ? (kb0 - tc.k0) / g.Nk : 0;
  kb.kp = tb.kv + slot * g.kv_block_floats();
  kb.vp = kb.kp + g.k_block_floats();
  kb.nk_live = std::min(kb.nk, q.end_hi - kb0);
  kb.ncols = (kb.nk_live + g.W - 1) / g.W * g.W;
  kb.clean_hi = p.mask_kind != detail::MaskKind::none
                    ? 0
                    : std::max<std::int64_t>(0, std::min(kb.nk, q.end_lo - kb0));
  kb.clean_lo = std::clamp<std::int64_t>(q.begin_hi - kb0, 0, kb.nk);
  if (!detail::packs_k(q.path.kv) || (tc.keep_packed && slot < tb.packed_blocks)) return kb;
  PrefetchBlocksAhead(p, tc, kb0, kb0 == q.kb_first, g.Nk, tc.k0);
  if (q.path.kv == detail::KvUnit::packed_bf16) {
    if constexpr (detail::has_bf16_units(kUnit)) {
      Bf16Tile<O>::PackK(p, tc.b, tc.hk, kb0, kb.nk, reinterpret_cast<std::uint32_t*>(kb.kp));
      Bf16Tile<O>::PackV(p, g.DvP, tc.b, tc.hk, kb0, kb.nk,
                         reinterpret_cast<std::uint32_t*>(kb.vp));
    }
  } else {
    const float kscale = q.path.q == detail::QUnit::f32_in_place ? detail::log2_scale(p) : 1.0f;
    if (q.path.kv == detail::KvUnit::k_packed) {
      PackK<O>(p, g, tc.b, tc.hk, kb0, kb.nk, kscale, kb.kp);
    } else {
      PackKV<O>(p, g, tc.b, tc.hk, kb0, kb.nk, kscale, kb.kp, kb.vp);
    }
  }
  if (tc.keep_packed) tb.packed_blocks = slot + 1;
  return kb;
}

// Each row's visible keys [begin, end) within the key block, its ALiBi position relative to the
// block's first key (clamped far outside it: the distance only grows), and its mask row.
CPUATTN_ALWAYS_INLINE void SetRowMasks(const detail::Problem& p, const TaskCoords& tc,
                                       const QueryBlock& q, const KeyBlock& kb, RowMask* rm) {
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(p.mask.dtype));
  for (std::int64_t i = q.pos0, r = 0; i < q.pos1; ++i) {
    const auto end = static_cast<std::int32_t>(
        std::clamp<std::int64_t>(std::min(tc.k1, p.key_end(tc.b, i)) - kb.kb0, 0, kb.nk));
    const auto begin =
        static_cast<std::int32_t>(std::clamp<std::int64_t>(p.key_begin(i) - kb.kb0, 0, kb.nk));
    const auto pos = static_cast<std::int32_t>(std::clamp<std::int64_t>(
        p.pos(i) - kb.kb0, -(std::int64_t{1} << 30), std::int64_t{1} << 30));
    for (std::int64_t h = tc.h0; h < tc.h0 + tc.nh; ++h, ++r) {
      rm[r].begin = begin;
      rm[r].end = end;
      rm[r].pos = pos;
      rm[r].mask =
          p.mask_kind == detail::MaskKind::none
              ? nullptr
              : static_cast<const char*>(p.mask.data) + (tc.b * p.mask.s[0] + h * p.mask.s[1] +
                                                         i * p.mask.s[2] + kb.kb0 * p.mask.s[3]) *
                                                            esize;
    }
  }
}

// The rows [lo, hi) of K/V head `head` (the j-th of the task) within a block.
struct HeadRows {
  std::int64_t j, head;
  int lo, hi;
};

// ScoreUnit: S rows [hr.lo, hr.hi) of the key block. Tiles mask in their epilogue; streamed
// rows are masked in a pass over S, skipped for a row with no mask tensor that sees every column
// (decoding's usual case).
template <class O, detail::FlashUnit kUnit>
void ScoreBlock(const detail::Problem& p, const TaskCoords& tc, const QueryBlock& q,
                const Geometry<O>& g, const KeyBlock& kb, const HeadRows& hr, const MaskInfo& mi,
                TaskBuffers& tb, detail::PhaseClock& clock) {
  using detail::ScoreUnit;
  const int n = hr.hi - hr.lo;
  const float* qp = q.qrows + hr.lo * q.qs;
  float* s = tb.s + hr.lo * g.Nk;
  const bool hilo = q.path.q == detail::QUnit::f32_hilo;
  switch (q.path.score) {
    case ScoreUnit::tile_f32:
      ScoreBlockTiles<O>(n, qp, q.qs, g.D, kb.kp, kb.ncols, kb.clean_lo, kb.clean_hi, s, g.Nk,
                         tb.rm + hr.lo, mi, [&] { tb.ahead.Drip(p); });
      clock.lap(Phase::scores);
      return;
    case ScoreUnit::tile_bf16:
      if constexpr (detail::has_bf16_units(kUnit))
        Bf16Tile<O>::ScoreBlock(
            n, reinterpret_cast<const std::uint32_t*>(tb.qp) + hr.lo * ((p.D + 1) / 2),
            (p.D + 1) / 2, (p.D + 1) / 2, reinterpret_cast<const std::uint32_t*>(kb.kp), kb.ncols,
            kb.clean_lo, kb.clean_hi, detail::log2_scale(p), s, g.Nk, tb.rm + hr.lo, mi,
            [&] { tb.ahead.Drip(p); });
      clock.lap(Phase::scores);
      return;
    case ScoreUnit::tile_amx:
      // Raw dot products, scaled, then masked in a pass over S as the streamed units' are, where
      // the block has row masks (RunKeyBlocks sets them for a tiled block that is not clean).
      if constexpr (detail::has_bf16_units(kUnit)) {
        const std::int64_t qs2 = (p.D + 1) / 2;
        Bf16Amx<O>::Scores(n, reinterpret_cast<const std::uint32_t*>(tb.qp) + hr.lo * qs2, qs2, qs2,
                           reinterpret_cast<const std::uint32_t*>(kb.kp), kb.ncols, s, g.Nk,
                           [&] { tb.ahead.Drip(p); });
        Bf16Amx<O>::ScaleRows(n, s, g.Nk, kb.ncols, detail::log2_scale(p));
      }
      clock.lap(Phase::scores);
      if (!kb.clean() || mi.transforms())
        for (int r = hr.lo; r < hr.hi; ++r)
          MaskScoreRow<O>(tb.s + r * g.Nk, kb.ncols, tb.rm[r], mi);
      clock.lap(Phase::mask);
      return;
    case ScoreUnit::dot: {
      // A paged block's next block lies in another page, and so do its int8 scales.
      PrefetchRunScales(p, tc.b, kb.kb0, g.Nk, std::min(tc.k1 - kb.kb0, 2 * g.Nk), hr.head);
      // P V of the block (or head) before asked for these K rows, unless this is the first read.
      const bool k_asked =
          q.path.k_ahead && !q.path.scores_k_ahead && (kb.kb0 > q.kb_first || hr.j > 0);
      if (hilo) {
        if constexpr (detail::has_bf16_units(kUnit))
          ScoreBlockDot<O, true>(p, tc.b, hr.head, kb.kb0, kb.nk_live, tc.k1, n, qp, q.qs, s, g.Nk,
                                 false, k_asked, q.path.v_ahead_l2);
      } else {
        ScoreBlockDot<O, false>(p, tc.b, hr.head, kb.kb0, kb.nk_live, tc.k1, n, qp, q.qs, s, g.Nk,
                                q.k_lo, k_asked, q.path.v_ahead_l2);
      }
      break;
    }
    case ScoreUnit::dot_runs:
      if (hilo) {
        if constexpr (detail::has_bf16_units(kUnit))
          ScoreBlockRuns<O, true>(p, tc.b, tc.hk, tc.nhk, hr.j, kb.kb0, kb.nk_live, g.Nk, tc.k1, n,
                                  qp, q.qs, s, g.Nk, q.path.runs_ahead);
      } else {
        ScoreBlockRuns<O, false>(p, tc.b, tc.hk, tc.nhk, hr.j, kb.kb0, kb.nk_live, g.Nk, tc.k1, n,
                                 qp, q.qs, s, g.Nk, q.path.runs_ahead);
      }
      break;
  }
  clock.lap(Phase::scores);
  for (int r = hr.lo; r < hr.hi; ++r) {
    const RowMask& rm = tb.rm[r];
    if (rm.mask != nullptr || rm.end < kb.ncols || rm.begin > 0 || mi.transforms())
      MaskScoreRow<O>(tb.s + r * g.Nk, kb.ncols, rm, mi);
  }
  clock.lap(Phase::mask);
}

// The tiled score units on a block that no row needs masked or transformed, once every row has a
// finite max, or while no row has seen a key: scores and softmax in one pass
// (ProbBlockTiles; Bf16Tile::ProbBlock, Pb ready for P V; the AMX tiles' scores pass through S
// to Bf16Tile's probability tiles, ProbBlockFrom). The block's sums wait on the stack
// until every tile has passed. False if the block must take the two passes (ScoreBlock,
// SoftmaxRows), which then overwrite S and Pb.
template <class O, detail::FlashUnit kUnit>
bool LazyProbs(const detail::Problem& p, const QueryBlock& q, const Geometry<O>& g,
               const KeyBlock& kb, const HeadRows& hr, const MaskInfo& mi, bool exact_pv,
               TaskBuffers& tb) {
  using detail::ScoreUnit;
  constexpr int N = O::kLanes;
  const bool f32 = q.path.score == ScoreUnit::tile_f32;
  if (!q.path.tiled() || exact_pv || mi.transforms() || q.k_lo || !kb.clean()) return false;
  const int n = hr.hi - hr.lo;
  if (n > O::kBlockRows) return false;  // plans keep tiled blocks to kBlockRows rows
  // Rows that have all seen a block, or none: a row with no key yet has l = 0 and Acc = 0
  // (OnlineSoftmaxRow), so its first block's weights may be taken against any m.
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool first = tb.m[hr.lo] == neg_inf;
  for (int r = hr.lo; r < hr.hi; ++r)
    if (first ? tb.m[r] != neg_inf : !std::isfinite(tb.m[r])) return false;
  alignas(64) float lsum[O::kBlockRows * N];
  bool ok = false;
  if (f32) {
    ok = ProbBlockTiles<O>(n, q.qrows + hr.lo * q.qs, q.qs, g.D, kb.kp, kb.ncols, tb.m + hr.lo,
                           first, tb.s + hr.lo * g.Nk, g.Nk, lsum, N, [&] { tb.ahead.Drip(p); });
  } else if constexpr (detail::has_bf16_units(kUnit)) {
    const std::int64_t qs2 = (p.D + 1) / 2;
    const auto* qb = reinterpret_cast<const std::uint32_t*>(tb.qp) + hr.lo * qs2;
    const auto* kp = reinterpret_cast<const std::uint32_t*>(kb.kp);
    const float qscale = detail::log2_scale(p);
    if (q.path.score == ScoreUnit::tile_amx) {
      // The AMX tiles' raw dot products wait in S for the probability tiles.
      float* s = tb.s + hr.lo * g.Nk;
      Bf16Amx<O>::Scores(n, qb, qs2, qs2, kp, kb.ncols, s, g.Nk, [&] { tb.ahead.Drip(p); });
      ok = Bf16Tile<O>::ProbBlockFrom(
          n,
          [&](int r0, std::int64_t c0) {
            return typename Bf16Tile<O>::SavedDots{s + r0 * g.Nk + c0, g.Nk};
          },
          kb.ncols, qscale, tb.m + hr.lo, first, tb.pb + hr.lo * g.Nk, g.Nk, lsum, N, [] {});
    } else {
      ok = Bf16Tile<O>::ProbBlock(n, qb, qs2, qs2, kp, kb.ncols, qscale, tb.m + hr.lo, first,
                                  tb.pb + hr.lo * g.Nk, g.Nk, lsum, N, [&] { tb.ahead.Drip(p); });
    }
  }
  if (!ok) return false;
  for (int r = 0; r < n; ++r)
    O::Store(O::Add(O::Load(tb.l + (hr.lo + r) * N), O::Load(lsum + r * N)),
             tb.l + (hr.lo + r) * N);
  return true;
}

// The online softmax of rows [hr.lo, hr.hi) over the key block. The native bf16 P V tiles take
// the probabilities rounded to bf16 (Pb) straight from it; every other unit, and P V that skips
// the keys of weight 0, reads them in S.
template <class O, detail::FlashUnit kUnit>
CPUATTN_ALWAYS_INLINE void SoftmaxRows(const QueryBlock& q, const Geometry<O>& g,
                                       const KeyBlock& kb, const HeadRows& hr, bool exact_pv,
                                       TaskBuffers& tb) {
  constexpr int N = O::kLanes;
  if constexpr (detail::has_bf16_units(kUnit)) {
    if ((q.path.pv == detail::PvUnit::tile_bf16 || q.path.pv == detail::PvUnit::tile_amx) &&
        !exact_pv) {
      for (int r = hr.lo; r < hr.hi; ++r)
        OnlineSoftmaxRow<O>(tb.s + r * g.Nk, kb.ncols, tb.m[r], tb.l + r * N, tb.acc + r * g.DvP,
                            g.DvP, typename Bf16Tile<O>::PutRounded{tb.pb + r * g.Nk});
      return;
    }
  }
  for (int r = hr.lo; r < hr.hi; ++r)
    OnlineSoftmaxRow<O>(tb.s + r * g.Nk, kb.ncols, tb.m[r], tb.l + r * N, tb.acc + r * g.DvP,
                        g.DvP);
}

// PvUnit: Acc rows [hr.lo, hr.hi) += P V over the key block; with BlockPath::k_ahead the
// streamed units prefetch the K rows the scores read next as they go (KeyAheadOf). With `out`
// (BlockPath::out_in_pv, the query block's last key block), the f32 tiles write the rows'
// outputs too.
template <class O, detail::FlashUnit kUnit>
void PvBlock(const detail::Problem& p, const TaskCoords& tc, const QueryBlock& q,
             const Geometry<O>& g, const KeyBlock& kb, const HeadRows& hr, TaskBuffers& tb,
             const PvOut* out) {
  using detail::PvUnit;
  float* acc = tb.acc;
  // The K rows the scores read next: the next K/V head's of this block (a paged task's heads go
  // one after another through the block's page, which is read front to back), or the first
  // head's of the next block.
  const detail::KeyAhead ahead =
      !q.path.k_ahead ? detail::KeyAhead{}
      : hr.j + 1 < tc.nhk
          ? KeyAheadOf(p, tc.b, hr.head + 1, kb.kb0, kb.kb0 + kb.nk_live)
          : KeyAheadOf(p, tc.b, tc.hk, kb.kb0 + g.Nk, std::min(tc.k1, kb.kb0 + 2 * g.Nk));
  switch (q.path.pv) {
    case PvUnit::tile_f32: {
      if (q.path.kv == detail::KvUnit::v_packed)
        PackV<O>(p, g, tc.b, hr.head, kb.kb0, kb.nk, kb.vp);
      const bool in_place = q.path.kv == detail::KvUnit::k_packed;
      const float* v = in_place ? static_cast<const float*>(p.v.data) +
                                      p.key_off(p.v.s, tc.b, kb.kb0) + hr.head * p.v.s[1]
                                : kb.vp;
      // A block that some row does not see whole has its row masks set (RunKeyBlocks).
      PvBlockTiles<O>(hr.lo, hr.hi, tb.s, g.Nk, v, in_place, p.v.s[2], kb.nk, kb.nk_live,
                      kb.clean() ? nullptr : tb.rm, acc, g.DvP, out, [&] { tb.ahead.Drip(p); });
      return;
    }
    case PvUnit::tile_bf16:
      if constexpr (detail::has_bf16_units(kUnit))
        Bf16Tile<O>::PvBlock(hr.hi - hr.lo, tb.pb + hr.lo * g.Nk, g.Nk,
                             reinterpret_cast<const std::uint32_t*>(kb.vp), kb.nk, kb.nk_live,
                             acc + hr.lo * g.DvP, g.DvP, [&] { tb.ahead.Drip(p); });
      return;
    case PvUnit::tile_amx:
      if constexpr (detail::has_bf16_units(kUnit))
        Bf16Amx<O>::PvBlock(hr.hi - hr.lo, tb.pb + hr.lo * g.Nk, g.Nk,
                            reinterpret_cast<const std::uint32_t*>(kb.vp), kb.nk, kb.nk_live,
                            acc + hr.lo * g.DvP, g.DvP, [&] { tb.ahead.Drip(p); });
      return;
    case PvUnit::runs: {
      const bool v_lo = VScalesAllowLo(p, tc.b, hr.head, kb.kb0, kb.nk_live);
      if (p.v_scale != nullptr || v_lo)
        ScalePByVScales<O>(p, tc.b, hr.head, kb.kb0, kb.nk_live, hr.lo, hr.hi, tb.s, g.Nk,
                           v_lo ? detail::kFp8LoFactor : 1.0f);
      PvBlockRuns<O>(p, tc.b, hr.head, kb.kb0, kb.nk_live, hr.lo, hr.hi, tb.s, g.Nk, acc, g.DvP,
                     v_lo, ahead);
      if (v_lo)
        SetNanValueColumns<O>(p, tc.b, hr.head, kb.kb0, kb.nk_live, hr.lo, hr.hi, acc, g.DvP);
      return;
    }
    case PvUnit::runs_bf16:
      if constexpr (detail::has_bf16_units(kUnit))
        Bf16Stream<O>::PvBlock(p, tc.b, hr.head, kb.kb0, kb.nk_live, kb.ncols, hr.lo, hr.hi, tb.s,
                               g.Nk, tb.pb, acc, g.DvP, ahead);
      return;
    case PvUnit::runs_vnni:
      if constexpr (detail::has_vnni_units(kUnit))
        VnniI8<O>::PvBlock(p, tc.b, hr.head, kb.kb0, kb.nk_live, hr.lo, hr.hi, tb.s, g.Nk, tb.pb,
                           acc, g.DvP, ahead);
      return;
  }
}

// Row r's softmax state (head h): its running max, sum and the head's sink.
template <class O>
CPUATTN_ALWAYS_INLINE detail::RowState RowStateOf(const detail::Problem& p, const TaskBuffers& tb,
                                                  std::int64_t r, std::int64_t h) {
  return {tb.m[r], O::ReduceSum(O::Load(tb.l + r * O::kLanes)),
          static_cast<float>(p.sink(h) * detail::kLog2e)};
}

// BlockPath::out_in_pv: the out rows and scales of rows [hr.lo, hr.hi) for the P V tiles of the
// query block's last key block, whose softmax has made m and l final.
template <class O>
PvOut SetOutRows(const detail::Problem& p, const TaskCoords& tc, const QueryBlock& q,
                 const HeadRows& hr, detail::OutUnit unit, const TaskBuffers& tb) {
  detail::ForQueryRows(q.pos0, tc.h0, tc.nh, hr.lo, hr.hi,
                       [&](std::int64_t r, std::int64_t i, std::int64_t h) {
                         tb.out_scale[r] = RowStateOf<O>(p, tb, r, h).out_scale();
                         tb.out_rows[r] = static_cast<float*>(p.out) + OutRowOffset(p, tc.b, h, i);
                       });
  return {tb.out_rows, tb.out_scale, unit == detail::OutUnit::f32_stream};
}

// The query block's key blocks folded into each row's m, l and Acc. exact_pv: P V skips the
// keys of weight 0 (PvSkipZero), for a block whose first run met a non-finite value in a key it
// excludes. With several K/V heads (paged decoding) the heads run one after another through the
// same block, so each page's [Hkv, P, D] is read front to back and a head's V rows are used while
// the prefetch has them in L2. True if the last key block's P V wrote the rows' outputs
// (BlockPath::out_in_pv, not with exact_pv; `out` is the call's output unit).
template <class O, detail::FlashUnit kUnit>
bool RunKeyBlocks(const detail::Problem& p, const TaskCoords& tc, const QueryBlock& q,
                  const Geometry<O>& g, const MaskInfo& mi, TaskBuffers& tb, detail::OutUnit out,
                  bool exact_pv, detail::PhaseClock& clock) {
  constexpr int N = O::kLanes;
  for (int r = 0; r < q.rows; ++r) {
    tb.m[r] = -std::numeric_limits<float>::infinity();
    O::Store(O::Zero(), tb.l + r * N);
  }
  std::fill(tb.acc, tb.acc + q.rows * g.DvP, 0.0f);
  const bool tiled = q.path.tiled();
  bool written = false;
  for (std::int64_t kb0 = q.kb_first; kb0 < q.end_hi; kb0 += g.Nk) {
    const KeyBlock kb = LoadKeyBlock<O, kUnit>(p, tc, q, g, kb0, tb);
    clock.lap(Phase::pack_kv);
    // Tiles read the row masks only in masked panels and for soft-cap or ALiBi: a prefill's
    // blocks below the diagonal skip them (docs/performance.md#dm-row-masks-skipped).
    if (!tiled || !kb.clean() || mi.transforms()) SetRowMasks(p, tc, q, kb, tb.rm);
    clock.lap(Phase::mask);
    for (std::int64_t j = 0; j < tc.nhk; ++j) {
      const HeadRows hr{j, tc.hk + j, static_cast<int>(j) * q.head_rows,
                        static_cast<int>(j + 1) * q.head_rows};
      if (LazyProbs<O, kUnit>(p, q, g, kb, hr, mi, exact_pv, tb)) {
        clock.lap(Phase::scores);
        tb.ahead.Next(p);
      } else {
        ScoreBlock<O, kUnit>(p, tc, q, g, kb, hr, mi, tb, clock);
        tb.ahead.Next(p);
        SoftmaxRows<O, kUnit>(q, g, kb, hr, exact_pv, tb);
      }
      clock.lap(Phase::softmax);
      if (exact_pv) {
        PvSkipZero<O>(p, tc.b, hr.head, kb0, kb.nk_live, hr.hi - hr.lo, tb.s + hr.lo * g.Nk, g.Nk,
                      tb.acc + hr.lo * g.DvP, g.DvP);
      } else if (q.path.out_in_pv && kb0 + g.Nk >= q.end_hi) {
        const PvOut rows_out = SetOutRows<O>(p, tc, q, hr, out, tb);
        PvBlock<O, kUnit>(p, tc, q, g, kb, hr, tb, &rows_out);
        written = true;
      } else {
        PvBlock<O, kUnit>(p, tc, q, g, kb, hr, tb, nullptr);
      }
      tb.ahead.Next(p);
      clock.lap(Phase::pv);
    }
  }
  if constexpr (detail::has_vnni_units(kUnit)) {
    if (q.path.permuted() && !exact_pv) PairOrder<O>::UnpermuteAcc(tb.acc, q.rows, g.DvP, g.Dv);
  }
  return written;
}

// The output epilogue of the query block's rows: normalised into out (and lse), or the
// unnormalised state into the split-key partials; only the lse where the P V tiles wrote the
// rows (`rows_written`, BlockPath::out_in_pv).
template <class O>
void WriteQueryBlock(const detail::Problem& p, const detail::Plan& pl, const TaskCoords& tc,
                     const QueryBlock& q, const Geometry<O>& g, const TaskBuffers& tb,
                     bool rows_written) {
  if (rows_written && p.lse == nullptr) return;
  detail::ForQueryRows(q.pos0, tc.h0, tc.nh, 0, q.rows,
                       [&](std::int64_t r, std::int64_t i, std::int64_t h) {
                         const detail::RowState st = RowStateOf<O>(p, tb, r, h);
                         if (rows_written) {
                           WriteLse(p, st, tc.b, h, i);
                         } else if (pl.path.out == detail::OutUnit::partials) {
                           WritePartial(p, pl, st, tb.acc + r * g.DvP, tc.b, h, i, tc.ks);
                         } else {
                           WriteRow<O>(p, pl.path.out, st, tb.acc + r * g.DvP, tc.b, h, i);
                         }
                       });
}

// How many of task tn's K/V rows, from its first key block's kb_first on, the task before it asks
// for while it runs (InputsAheadOf): up to Plan::ahead_kv_bytes.
CPUATTN_ALWAYS_INLINE std::int64_t KeysAskedAhead(const detail::Problem& p, const detail::Plan& pl,
                                                  const TaskCoords& tn, std::int64_t kb_first) {
  return std::clamp<std::int64_t>(pl.ahead_kv_bytes / InputsAhead::KvRowBytes(p), 0,
                                  std::max<std::int64_t>(0, tn.k1 - kb_first));
}

// The InputsAhead of query block qb of task t, in two shares per key block and K/V head of the
// block (one after its scores, one after its P V).
template <class O>
InputsAhead InputsAheadOf(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
                          const TaskCoords& tc, const QueryBlock& q, std::int64_t qb,
                          const Geometry<O>& g) {
  InputsAhead a;
  if (!detail::packs_k(q.path.kv)) return a;
  const bool last = qb + 1 == tc.qb1;
  if (!last) {
    const QueryBlock qq = QueryBlockOf<O>(p, pl, tc, g, qb + 1);
    a = {tc.b, tc.h0, tc.nh, qq.pos0, qq.rows};
  }
  if (t + 1 < pl.tasks) {
    const TaskCoords tn = DecodeTask(p, pl, t + 1);
    const QueryBlock qn = QueryBlockOf<O>(p, pl, tn, g, tn.qb0);
    if (detail::packs_k(qn.path.kv)) {
      if (last) a = {tn.b, tn.h0, tn.nh, qn.pos0, qn.rows};
      const std::int64_t keys = KeysAskedAhead(p, pl, tn, qn.kb_first);
      // The task's first block reads its own K/V from memory; the later ones only compute, and
      // take the next task's keys in n - 1 slices (a one-block task takes them all).
      const std::int64_t n = tc.qb1 - tc.qb0, i = qb - tc.qb0;
      if (n == 1 || i > 0) {
        const std::int64_t parts = std::max<std::int64_t>(n - 1, 1), slice = n == 1 ? 0 : i - 1;
        a.b_kv = tn.b;
        a.hk = tn.hk;
        a.kb = qn.kb_first + keys * slice / parts;
        a.nk = keys * (slice + 1) / parts - keys * slice / parts;
      }
    }
  }
  const std::int64_t blocks = std::max<std::int64_t>(1, (q.end_hi - q.kb_first + g.Nk - 1) / g.Nk);
  a.shares = 2 * blocks * tc.nhk;
  a.lines = a.rows * InputsAhead::QRowLines(p) + a.nk * InputsAhead::KvRowLines(p);
  if (q.path.tiled()) {
    // Every tile of every key block and K/V head calls Drip (f32 and native bf16 alike).
    const std::int64_t tiles = q.path.score == detail::ScoreUnit::tile_amx
                                   ? g.amx_block_tiles(q.head_rows)
                                   : g.block_tiles(q.head_rows);
    const std::int64_t drips = std::max<std::int64_t>(1, tiles * blocks * tc.nhk);
    a.per_tile = (a.lines + drips - 1) / drips;
  }
  return a;
}

// FlashPath::keys_as_rows: task t's query blocks with keys in the tiles' rows (keys_rows-inl.h),
// K/V read in place, the next task's inputs dripped after each tile. Its own K/V rows are
// prefetched into L2 two blocks ahead as the tiled path does, but only those past the keys the
// task before dripped: asking for those lines again, 1,024 prefetches per block that hit L2, cost
// more than the few tasks that start on a thread after another thread's task save
// (docs/performance.md#dm-kr-asked-once). False where a block's sums are not finite: the task then
// runs on the plan's tiled units, which write every row of it again (their exact rerun handles
// such blocks).
template <class O>
bool RunKeysAsRows(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
                   const TaskCoords& tc, const Geometry<O>& g, TaskBuffers& tb,
                   detail::PhaseClock& clock) {
  using KR = KeysAsRows<O>;
  const bool stream = pl.path.out == detail::OutUnit::f32_stream;
  const auto drip = [&] { tb.ahead.Drip(p); };
  const float* K = static_cast<const float*>(p.k.data) + tc.b * p.k.s[0] + tc.hk * p.k.s[1];
  const float* V = static_cast<const float*>(p.v.data) + tc.b * p.v.s[0] + tc.hk * p.v.s[1];
  for (std::int64_t qb = tc.qb0; qb < tc.qb1; ++qb) {
    const QueryBlock q = QueryBlockOf<O>(p, pl, tc, g, qb);
    const int qp = (q.rows + KR::kChunk - 1) / KR::kChunk * KR::kChunk;
    const typename KR::Block blk{tc.b, tc.h0, q.pos0, q.rows, qp};
    KR::TransposeQ(p, blk, tb.qp);
    const std::int64_t asked_to =
        t > 0 && detail::packs_k(q.path.kv) ? tc.k0 + KeysAskedAhead(p, pl, tc, tc.k0) : tc.k0;
    tb.ahead = InputsAheadOf<O>(p, pl, t, tc, q, qb, g);
    std::fill(tb.m, tb.m + qp, -std::numeric_limits<float>::infinity());
    std::fill(tb.l, tb.l + qp, 0.0f);
    std::fill(tb.acc, tb.acc + p.Dv * qp, 0.0f);
    clock.lap(Phase::pack_q);
    for (std::int64_t kb0 = tc.k0; kb0 < tc.k1; kb0 += g.Nk) {
      const std::int64_t nk = std::min(g.Nk, tc.k1 - kb0);
      PrefetchBlocksAhead(p, tc, kb0, kb0 == tc.k0, g.Nk, asked_to);
      const float* k = K + kb0 * p.k.s[2];
      // After the task's first block every lane's m is finite (no key is masked on this path).
      if (kb0 > tc.k0 &&
          KR::ProbBlock(k, p.k.s[2], p.D, nk, tb.qp, qp, tb.m, tb.s, tb.out_scale, drip)) {
        KR::AddSums(qp, tb.out_scale, tb.l);
        clock.lap(Phase::scores);
      } else {
        KR::ScoreBlock(k, p.k.s[2], p.D, nk, tb.qp, qp, tb.m, tb.s, tb.out_scale, drip);
        clock.lap(Phase::scores);
        KR::Softmax(nk, p.Dv, qp, tb.s, tb.m, tb.out_scale, tb.l, tb.acc);
        clock.lap(Phase::softmax);
      }
      KR::PvBlock(V + kb0 * p.v.s[2], p.v.s[2], p.Dv, nk, tb.s, qp, tb.acc, drip);
      clock.lap(Phase::pv);
    }
    if (!AccFinite<O>(tb.acc, p.Dv * qp) || !AccFinite<O>(tb.l, qp)) return false;
    tb.ahead.Rest(p);
    KR::WriteOut(p, blk, tb.acc, tb.l, stream);
    clock.lap(Phase::output);
  }
  if (stream) O::StreamFence();
  return true;
}

// Runs task t of the plan (see TaskCoords). With a log (profiling on) the time is split into
// phases at every step of every key block; without one each step's check is a predicted branch.
template <class O, detail::FlashUnit kUnit = detail::FlashUnit::portable>
void RunTask(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
             detail::Scratch& scratch, detail::ThreadLog* log) {
  static_assert(simd::VectorOps<O>);
  detail::PhaseClock clock(log);
  const Geometry<O> g(p, O::kBlockKeys);
  const TaskCoords tc = DecodeTask(p, pl, t);
  TaskBuffers tb = LayOutTask<O>(p, pl, tc, g, scratch);
  if (pl.path.keys_as_rows && RunKeysAsRows<O>(p, pl, t, tc, g, tb, clock)) return;
  const MaskInfo mi = MaskInfoOf(p);
  for (std::int64_t qb = tc.qb0; qb < tc.qb1; ++qb) {
    QueryBlock q = QueryBlockOf<O>(p, pl, tc, g, qb);
    PackQueries<O, kUnit>(p, tc, q, tb);
    tb.ahead = InputsAheadOf<O>(p, pl, t, tc, q, qb, g);
    clock.lap(Phase::pack_q);
    SetRowSlopes(p, tc, q, mi, tb.rm);
    bool written = RunKeyBlocks<O, kUnit>(p, tc, q, g, mi, tb, pl.path.out, false, clock);
    if (!AccFinite<O>(tb.acc, q.rows * g.DvP))
      written = RunKeyBlocks<O, kUnit>(p, tc, q, g, mi, tb, pl.path.out, true, clock);
    tb.ahead.Rest(p);
    WriteQueryBlock<O>(p, pl, tc, q, g, tb, written);
    clock.lap(Phase::output);
  }
  // Non-temporal stores are weakly ordered: complete them before the task reports done.
  if (pl.path.out == detail::OutUnit::f32_stream) O::StreamFence();
  clock.lap(Phase::output);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_DRIVER_INL_H_
