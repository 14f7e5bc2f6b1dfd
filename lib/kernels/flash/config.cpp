// plan_flash(): the flash op's one decision (config.h). Every measured reason behind a rule here
// is in docs/performance.md ("Design measurements behind the code").
#include "kernels/flash/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/dispatch.h"
#include "kernels/flash/flash.h"
#include "kv/elem.h"

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

// The L2 of one core in bytes, as the OS reports it (sysconf; glibc reads cpuid on x86), or 512
// KiB, the smallest L2 of the cores cpuattn targets, when it does not.
std::int64_t l2_bytes() {
  static const std::int64_t n = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (v > 0) return static_cast<std::int64_t>(v);
#endif
    return std::int64_t{512} << 10;
  }();
  return n;
}

// L1d geometry as the OS reports it (sysconf; glibc reads cpuid on x86), or 32 KiB of 8 ways and
// 64-byte lines, the smallest L1d of the cores cpuattn targets, where it does not.
struct L1Geometry {
  std::int64_t sets, ways, line;
};
const L1Geometry& l1d() {
  static const L1Geometry g = [] {
    long size = 0, ways = 0, line = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL1_DCACHE_ASSOC) && \
    defined(_SC_LEVEL1_DCACHE_LINESIZE)
    size = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    ways = sysconf(_SC_LEVEL1_DCACHE_ASSOC);
    line = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
#endif
    if (size <= 0 || ways <= 0 || line <= 0 || size % (ways * line) != 0) {
      size = 32 << 10;
      ways = 8;
      line = 64;
    }
    return L1Geometry{size / (ways * line), ways, line};
  }();
  return g;
}

// Whether a column chunk of `chunk` floats of `keys` V rows `row` floats apart (a P V sweep of V
// in place, PvBlockTiles) holds in L1d at once: no set takes more of its lines than it has ways.
// A chunk narrower than its rows touches only that fraction of the sets: 128 rows of 512 B (Dv
// 128) put a 64-float chunk's 512 lines in 32 of 64 sets, 16 to a set, over the 8-12 ways of
// x86 cores, so each row strip of P V would read V from L2 again; packed, the same chunk fills
// every set 8 deep (docs/performance.md#dm-v-in-place-sets).
// Every call plans its tiled blocks, decoding steps too: the last answer is kept per thread (a
// service repeats its shapes), so a call pays the count of a few hundred lines only on a change.
bool v_chunk_fits_l1(std::int64_t row, std::int64_t chunk, std::int64_t keys) {
  struct Last {
    std::int64_t row = -1, chunk = -1, keys = -1;
    bool fits = false;
  };
  thread_local Last last;
  if (last.row == row && last.chunk == chunk && last.keys == keys) return last.fits;
  const L1Geometry& g = l1d();
  std::vector<std::int64_t> lines_in_set(static_cast<std::size_t>(g.sets), 0);
  const std::int64_t row_bytes = row * 4, chunk_bytes = chunk * 4;
  bool fits = true;
  for (std::int64_t r = 0; r < keys && fits; ++r)
    for (std::int64_t l = r * row_bytes / g.line; l <= (r * row_bytes + chunk_bytes - 1) / g.line;
         ++l)
      fits = fits && ++lines_in_set[static_cast<std::size_t>(l % g.sets)] <= g.ways;
  last = {row, chunk, keys, fits};
  return fits;
}

// Keys below which splitting the key range is not worth a merge.
constexpr std::int64_t kMinKeysPerSplit = 512;

// Outputs larger than this are written with non-temporal stores: an output 4x the 2 MiB L2 of a
// core cannot stay in L2 for whatever reads it next, and a plain store first reads each line
// for ownership. Smaller outputs keep plain stores, so a consumer finds them in cache.
constexpr std::int64_t kStreamOutBytes = std::int64_t{8} << 20;

// Blocks, head splits, query chunks and key splits of `p` for a kernel with these block sizes,
// for `share` of the machine's target_tasks(): a paged batch runs one problem per sequence, and
// each planned for the whole target split every sequence's keys as if it ran alone (8 sequences
// of 16384 keys on 2 cores took 16 key splits each where 2 give the set its 16 tasks), paying
// partials, a merge and a cold start per task (docs/performance.md#dm-set-share).
Plan plan_tasks(const Problem& p, std::int64_t block_rows, std::int64_t block_keys, double share) {
  const auto target = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(static_cast<double>(target_tasks()) * share)));
  Plan pl;
  pl.heads_per_block = std::min(p.group, block_rows);
  pl.pos_per_block = std::max<std::int64_t>(1, block_rows / pl.heads_per_block);
  pl.rows = pl.heads_per_block * pl.pos_per_block;
  pl.head_splits = ceil_div(p.group, pl.heads_per_block);
  pl.q_blocks = ceil_div(p.Lq, pl.pos_per_block);
  // Paged decoding: a task takes every K/V head of its sequence (up to 64 rows) and, block by
  // block, runs them head after head through the same pages (driver-inl.h, RunKeyBlocks): head by
  // head across tasks, a page's [Hkv, P, D] is Hkv short runs read at different times, each of
  // which the hardware prefetchers must find anew. Each head's rows must fit the streaming units.
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
      std::clamp(ceil_div(target, units), std::int64_t{1}, pl.q_blocks);
  pl.blocks_per_chunk = ceil_div(pl.q_blocks, want_chunks);
  pl.q_chunks = ceil_div(pl.q_blocks, pl.blocks_per_chunk);
  // Short query ranges (decoding) leave too few tasks: split the keys and merge afterwards.
  std::int64_t splits = 1;
  if (units * pl.q_chunks < target) {
    splits = std::min(ceil_div(target, units * pl.q_chunks), ceil_div(p.Lk, kMinKeysPerSplit));
    splits = std::max<std::int64_t>(splits, 1);
  }
  pl.keys_per_split = ceil_div(ceil_div(p.Lk, splits), block_keys) * block_keys;
  pl.k_splits = ceil_div(p.Lk, pl.keys_per_split);
  pl.tasks = units * pl.q_chunks * pl.k_splits;
  // Up to a whole L2 of the next task's K/V (driver-inl.h, InputsAhead), dripped over this
  // task's later tiles: half of a 512 KiB L2 left half of X1's next 512 KiB to arrive cold, and the
  // whole ran faster; on 1-2 MiB L2s, where half already covers X1, the whole measured within
  // noise of half (docs/performance.md#dm-kv-ahead-l2).
  pl.ahead_kv_bytes = l2_bytes();
  pl.partial_row_floats = p.Dv + 2;
  return pl;
}

// The units of one kind of query block. Tiled blocks pack K/V (natively as bf16 pairs when Q, K
// and V are bf16 on the native unit), except f32 V of whole-vector rows that follow one another,
// in one page per block (k_packed): the P V tile reads it where it is, the same micro-kernel over
// the same keys in the same order (the same sums), and the block skips a copy of V
// (docs/performance.md#dm-tiled-v-in-place). Rows further apart are packed: in a [B, L, H, D]
// tensor they lie H * D floats apart, often a multiple of 4 KiB, so a block's rows share a few L1
// sets and each row strip of P V would read V from L2 again. Streamed blocks read K/V in place.
// Contiguous K/V with V read in place split the two streams between the phases (k_ahead): the
// scores prefetch V beside K, P V the K read next, and K goes as one stream, four keys at a time
// (docs/performance.md#dm-k-ahead-in-pv, #dm-k-ahead-f32); so do pages of a multiple of the
// block, in which every block lies whole (#dm-paged-whole-blocks). That split is AMD's and ARM's;
// Intel reads such K in the runs below (Choice::key_runs). Otherwise K goes in four
// interleaved runs for smaller pages (a block's keys lie in several) and for contiguous K of
// 2-byte or f32 elements with several rows, and as one stream for 1-byte K and one-row blocks
// (bound by their instructions, they lost with runs).
// V is read in place where its rows are whole vectors and either a P V column chunk spans whole
// rows (then the rows are the packed layout itself) or the chunk's lines fit L1d's sets
// (v_chunk_fits_l1: not Dv 128 on x86). On the native unit, blocks of several rows
// per K/V head run bf16 K on the hi/lo dot and bf16 V (where the choice takes vdpbf16ps) or int8 V
// (Dv whole groups of 32) on the native P V runs; one row per K/V head keeps the f32 units (bound
// by memory, the native ones were slower there). Tiled bf16 blocks run on AMX where the choice
// has it (amx_tiles), else on vdpbf16ps.
BlockPath tiled_block(const Problem& p, const Choice& choice, bool native_bf16, bool whole_pages,
                      const FlashKernels& fk) {
  if (native_bf16 && amx_tiles(choice, p.q.dtype, p.k.dtype, p.D))
    return {QUnit::bf16, KvUnit::packed_bf16, ScoreUnit::tile_amx, PvUnit::tile_amx};
  if (native_bf16 && native_dot(p.q.dtype) == NativeDot::bf16_pairs &&
      native_dot(p.k.dtype) == NativeDot::bf16_pairs)
    return {QUnit::bf16, KvUnit::packed_bf16, ScoreUnit::tile_bf16, PvUnit::tile_bf16};
  const bool v_rows_whole =
      p.v.dtype == DType::f32 && p.Dv % fk.lanes == 0 && p.v.s[2] == p.Dv && whole_pages;
  const bool v_in_place =
      v_rows_whole && (p.Dv <= fk.pv_chunk || v_chunk_fits_l1(p.Dv, fk.pv_chunk, fk.block_keys));
  BlockPath b{QUnit::f32, v_in_place ? KvUnit::k_packed : KvUnit::packed_f32, ScoreUnit::tile_f32,
              PvUnit::tile_f32};
  b.v_in_place_declined = v_rows_whole && !v_in_place;
  return b;
}

// The runs ahead of a dot_runs block on a core where every prefetch hint fills L1
// (Choice::hints_fill_l1): each lock-step row asks for the V row of every run of the block and
// the K row of every run ahead, and on a Zen 3 bursts of 32 lines arrived whole, of 64 mostly,
// of 256 a third short (docs/performance.md#dm-zen3-prefetch-levels). So the runs ahead take
// what the block's V leaves of 64 lines: none for f32 at D 128 in pages of 16 (8 runs of 8 V
// lines each), all 8 for bf16 and int8 (#dm-runs-ahead-zen3).
int runs_ahead_within(const Problem& p, std::int64_t block_keys) {
  constexpr std::int64_t kStepLines = 64;
  const std::int64_t run_keys = p.pages == nullptr
                                    ? block_keys / 4
                                    : std::min(std::int64_t{1} << p.page_shift, block_keys / 4);
  const std::int64_t runs = (block_keys + run_keys - 1) / run_keys;
  const auto lines = [](std::int64_t n, DType t) {
    return (n * static_cast<std::int64_t>(dtype_size(t)) + 63) / 64;
  };
  const std::int64_t left = kStepLines - runs * lines(p.Dv, p.v.dtype);
  return static_cast<int>(std::clamp<std::int64_t>(left / lines(p.D, p.k.dtype), 0, kMaxRunsAhead));
}

BlockPath streamed_block(const Problem& p, const Choice& choice, FlashUnit unit, bool few,
                         bool whole_pages, const FlashKernels& fk) {
  const std::int64_t lanes = fk.lanes;
  // Both native units have the VNNI P V; bf16 products on vdpbf16ps only on the bf16 unit where
  // the choice takes them (that unit runs for AMX's tiles without them: the streamed blocks of
  // such a problem then keep the f32 units).
  const bool native = unit != FlashUnit::portable;
  const bool native_bf16 = unit == FlashUnit::avx512_bf16 && few && choice.bf16_dot;
  BlockPath b;
  b.q =
      native_bf16 && native_dot(p.k.dtype) == NativeDot::bf16_pairs ? QUnit::f32_hilo : QUnit::f32;
  b.kv = p.Dv % lanes == 0 ? KvUnit::in_place : KvUnit::v_packed;
  const NativeDot v_dot = native_dot(p.v.dtype);
  if (native_bf16 && p.Dv % 32 == 0 && v_dot == NativeDot::bf16_pairs) {
    b.pv = PvUnit::runs_bf16;
  } else if (native && few && p.Dv % 32 == 0 && v_dot == NativeDot::int16_pairs) {
    b.pv = PvUnit::runs_vnni;
  } else {
    b.pv = b.kv == KvUnit::in_place ? PvUnit::runs : PvUnit::tile_f32;
  }
  // On Intel (Choice::key_runs) K in place goes in the runs too, except 1-byte K outside the
  // native unit's few-row blocks: M2 int8, and D1 int8 capped at AVX2, read slower in runs there
  // (docs/performance.md#dm-key-runs-intel).
  const bool in_place = whole_pages && b.kv == KvUnit::in_place;
  const bool key_runs = choice.key_runs && (dtype_size(p.k.dtype) > 1 || b.pv == PvUnit::runs_vnni);
  b.k_ahead = in_place && !key_runs;
  b.k_ahead_declined = in_place && key_runs;
  b.scores_k_ahead = !(choice.narrow_k_once && dtype_size(p.k.dtype) == 2);
  const bool runs = in_place ? key_runs : p.pages != nullptr || (few && dtype_size(p.k.dtype) > 1);
  b.score = runs ? ScoreUnit::dot_runs : ScoreUnit::dot;
  if (runs && choice.hints_fill_l1) b.runs_ahead = runs_ahead_within(p, fk.block_keys);
  // 1-byte V asks for 2 lines per key at Dv 128, little for L1's fill buffers; on an Emerald
  // Rapids int8 decoding read slower with them in L2 (docs/performance.md#dm-decode-prefetch-zen3).
  b.v_ahead_l2 = (b.score == ScoreUnit::dot || b.k_ahead_declined) && choice.v_ahead_l2 &&
                 dtype_size(p.v.dtype) > 1;
  return b;
}

BlockPath choose_block(const Problem& p, const Choice& choice, FlashUnit unit, BlockKind kind,
                       const FlashKernels& fk) {
  // Blocks start at multiples of block_keys, so with pages of a multiple of it (both powers of
  // two) every block lies in one page and reads as contiguous K/V does.
  const bool whole_pages =
      p.pages == nullptr || (std::int64_t{1} << p.page_shift) % fk.block_keys == 0;
  if (kind == BlockKind::tiled)
    return tiled_block(p, choice, unit == FlashUnit::avx512_bf16, whole_pages, fk);
  return streamed_block(p, choice, unit, kind == BlockKind::stream_few, whole_pages, fk);
}

// Which kinds of query block the plan's tasks meet: blocks differ by their positions (the last
// block may be short), their heads (the last head split may be narrow) and whether their task
// keeps K/V packed (the last query chunk may hold one block); the first block, the first block
// of the last chunk and the last block cover every combination.
std::uint8_t kinds_met(const Problem& p, const Plan& pl) {
  const std::int64_t last_nh = p.group - (pl.head_splits - 1) * pl.heads_per_block;
  const std::int64_t last_chunk = (pl.q_chunks - 1) * pl.blocks_per_chunk;
  std::uint8_t kinds = 0;
  for (std::int64_t qb : {std::int64_t{0}, last_chunk, pl.q_blocks - 1}) {
    const std::int64_t chunk0 = qb / pl.blocks_per_chunk * pl.blocks_per_chunk;
    const bool reused = std::min(pl.q_blocks, chunk0 + pl.blocks_per_chunk) - chunk0 > 1;
    const std::int64_t pos = std::min(p.Lq - qb * pl.pos_per_block, pl.pos_per_block);
    for (std::int64_t nh : {pl.heads_per_block, last_nh}) {
      const std::int64_t head_rows = pl.kv_heads_per_task > 1 ? p.group : pos * nh;
      kinds |= std::uint8_t(1u << static_cast<int>(block_kind(head_rows, reused)));
    }
  }
  return kinds;
}

// Whether every task runs keys as the tiles' rows (FlashPath::keys_as_rows, keys_rows-inl.h):
// f32 throughout with no mask, variant or extra output, one query head per block and each task's
// K/V blocks read by one query block (X1: the tiled task would pack each K block for those 64 rows
// alone; with two blocks, S1, AVX2 ran slower: docs/performance.md#dm-keys-as-rows), all keys in
// one task, D and Dv whole vectors. From the shape and the machine's task target, never the
// thread count, so the same bits for any number of threads.
bool keys_as_rows_fits(const Problem& p, const Plan& pl, const FlashKernels& fk) {
  const FlashPath& path = pl.path;
  const bool f32 = p.q.dtype == DType::f32 && p.k.dtype == DType::f32 && p.v.dtype == DType::f32 &&
                   p.out_dtype == DType::f32;
  const bool plain = p.causal == Causal::none && p.mask_kind == MaskKind::none &&
                     p.key_lengths == nullptr && p.lse == nullptr && p.weights == nullptr &&
                     p.window_left < 0 && p.window_right < 0 && p.softcap == 0 && !p.has_alibi() &&
                     p.sinks == nullptr && p.pages == nullptr;
  const bool tiled_only = path.kinds == (1u << static_cast<int>(BlockKind::tiled));
  return f32 && plain && tiled_only && path.unit == FlashUnit::portable &&
         (path.out == OutUnit::f32 || path.out == OutUnit::f32_stream) && pl.heads_per_block == 1 &&
         pl.kv_heads_per_task == 1 && pl.blocks_per_chunk == 1 && p.D % fk.lanes == 0 &&
         p.Dv % fk.lanes == 0;
}

}  // namespace

bool amx_tiles(const Choice& choice, DType q, DType kv, std::int64_t D) {
  return choice.amx_bf16 && native_dot(q) == NativeDot::bf16_pairs &&
         native_dot(kv) == NativeDot::bf16_pairs && D % 32 == 0;
}

FlashUnit choose_unit(const Choice& choice, DType q, DType kv, std::int64_t rows, std::int64_t D) {
  const bool few_rows = rows >= 2 && rows <= kStreamRows;
  // Decoding steps of 2..kStreamRows rows per K/V head over int8 K/V (any Q): the VNNI P V,
  // on whichever native unit the target has.
  if (choice.target == Target::avx512_vnni)
    return native_dot(kv) == NativeDot::int16_pairs && few_rows ? FlashUnit::avx512_vnni
                                                                : FlashUnit::portable;
  if (choice.target != Target::avx512_bf16) return FlashUnit::portable;
  // Q, K and V bf16: the native tiles, on AMX where the choice has it. Decoding steps over bf16
  // K/V (any Q): the native streamed units, only where the choice takes vdpbf16ps
  // (Choice::bf16_dot); int8's VNNI P V wherever the target runs.
  if (amx_tiles(choice, q, kv, D) && rows > kStreamRows) return FlashUnit::avx512_bf16;
  const NativeDot k_dot = native_dot(kv);
  if (k_dot == NativeDot::bf16_pairs && !choice.bf16_dot) return FlashUnit::portable;
  if (native_dot(q) == NativeDot::bf16_pairs && k_dot == NativeDot::bf16_pairs)
    return FlashUnit::avx512_bf16;
  if (k_dot != NativeDot::none && few_rows) return FlashUnit::avx512_bf16;
  return FlashUnit::portable;
}

Plan plan_flash(const Problem& p, const Choice& choice, double share) {
  const FlashKernels& fk = flash_kernels(choice);
  Plan pl = plan_tasks(p, fk.block_rows, fk.block_keys, share);
  FlashPath& path = pl.path;
  path.unit = choose_unit(choice, p.q.dtype, p.k.dtype, p.Lq * p.group, p.D);
  for (int k = 0; k < kBlockKinds; ++k)
    path.block[k] = choose_block(p, choice, path.unit, static_cast<BlockKind>(k), fk);
  // A block of one query head reads f32 Q in place: its rows are Q's rows, stride q.s[2]
  // (docs/performance.md#dm-q-in-place). K's panels then carry scale * log2 e, which must be at
  // most 1 so that no finite K overflows f32 there (K near FLT_MAX with scale 30 did; a larger
  // scale keeps Q scaled, where the overflow was already the caller's range to keep).
  const bool q_rows_in_place = p.q.dtype == DType::f32 && pl.heads_per_block == 1 &&
                               pl.kv_heads_per_task == 1 && log2_scale(p) <= 1.0f;
  for (BlockPath& b : path.block)
    if (q_rows_in_place && b.q == QUnit::f32 && b.score == ScoreUnit::tile_f32)
      b.q = QUnit::f32_in_place;
  path.kinds = kinds_met(p, pl);
  for (int k = 0; k < kBlockKinds; ++k)
    path.q_hilo |= ((path.kinds >> k) & 1) != 0 && path.block[k].q == QUnit::f32_hilo;
  if (pl.k_splits > 1) {
    path.out = OutUnit::partials;
  } else if (p.out_dtype != DType::f32) {
    path.out = OutUnit::narrow;
  } else {
    path.out = p.B * p.H * p.Lq * p.Dv * 4 > kStreamOutBytes ? OutUnit::f32_stream : OutUnit::f32;
  }
  // The tiles write f32 rows, streamed or not (docs/performance.md#dm-out-in-pv).
  const bool f32_out = path.out == OutUnit::f32 || path.out == OutUnit::f32_stream;
  for (BlockPath& b : path.block)
    b.out_in_pv = f32_out && b.pv == PvUnit::tile_f32 && p.Dv % fk.lanes == 0;
  path.keys_as_rows = keys_as_rows_fits(p, pl, fk);
  return pl;
}

std::string path_name(const FlashPath& path) {
  static constexpr const char* kKind[] = {"tiled", "stream_one", "stream_few"};
  static constexpr const char* kScore[] = {"tile_f32", "tile_bf16", "dot", "dot_runs", "tile_amx"};
  static constexpr const char* kPv[] = {"tile_f32",  "tile_bf16", "runs",
                                        "runs_bf16", "runs_vnni", "tile_amx"};
  static constexpr const char* kOut[] = {"f32", "f32_stream", "narrow", "partials"};
  static constexpr const char* kUnit[] = {"portable:", "avx512_bf16:", "avx512_vnni:"};
  std::string s = kUnit[static_cast<int>(path.unit)];
  bool first = true;
  for (int k = 0; k < kBlockKinds; ++k) {
    if (((path.kinds >> k) & 1) == 0) continue;
    const BlockPath& b = path.block[k];
    s += first ? "" : ";";
    s += std::string(kKind[k]) + "=" + kScore[static_cast<int>(b.score)] +
         (b.q == QUnit::f32_hilo       ? "_hilo"
          : b.q == QUnit::f32_in_place ? "_qin"
                                       : "") +
         "+" +
         (b.kv == KvUnit::v_packed   ? "vpacked_"
          : b.kv == KvUnit::k_packed ? "vin_"
                                     : "") +
         kPv[static_cast<int>(b.pv)] + (b.k_ahead ? "+k_ahead" : "") +
         (b.k_ahead && !b.scores_k_ahead ? "+k_once" : "") +
         (b.v_ahead_l2 && b.score == ScoreUnit::dot ? "+v_l2" : "") +
         (b.score == ScoreUnit::dot_runs && b.runs_ahead < kMaxRunsAhead
              ? "+ahead" + std::to_string(b.runs_ahead)
              : "") +
         (b.out_in_pv ? "+out" : "");
    first = false;
  }
  return s + (path.keys_as_rows ? ";keys_rows" : "") + "/" + kOut[static_cast<int>(path.out)];
}

}  // namespace cpuattn::detail
