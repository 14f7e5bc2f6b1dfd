// attention() over a paged KV cache. The call is validated once, with each pool standing in as a
// [B, Hkv, P, D] view of its first page (dtypes, strides, heads, options), then the pools, block
// table and lengths are checked in full, and the call is cut into one problem per sequence whose
// K/V rows the kernels address through the block table (Problem::key_off): no page is copied.
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "api/attention.h"
#include "api/call_scope.h"
#include "api/checks.h"
#include "api/context_impl.h"
#include "core/problem.h"

namespace cpuattn {
namespace detail {
namespace {

// A pool [num_pages, Hkv, P, d] (or scales [num_pages, Hkv, P]) as the [B, Hkv, P, d] view of its
// first page that validate() reads.
TensorView first_page(const TensorView& pool, std::int64_t B) {
  TensorView t = pool;
  t.shape[0] = B;
  t.strides[0] = 0;
  return t;
}

using Paged = PagedProblems;

// The options a paged call takes, and the pools: [num_pages, Hkv, P, d] with the same pages, P a
// power of two. Returns the options validate() reads: the scales as the view of the first page
// (per token) or as they are (per head or tensor).
AttentionOptions paged_options(const TensorView& q, const PagedKv& kv,
                               const AttentionOptions& opts) {
  if (opts.mask) fail("mask is not supported with a paged KV cache; use causal or a window");
  if (opts.key_lengths)
    fail("key_lengths is not supported with a paged KV cache: seq_lens gives each length");
  if (opts.weights) fail("weights is not supported with a paged KV cache");
  if (opts.k_scales || opts.v_scales)
    fail("k_scales / v_scales go in PagedKv (f32 [num_pages, Hkv, P]) with a paged KV cache");
  check_view("Q", q, 4, 4);
  check_view("k_pages", kv.k_pages, 4, 4);
  check_view("v_pages", kv.v_pages, 4, 4);
  const std::int64_t num_pages = kv.k_pages.shape[0], P = kv.k_pages.shape[2];
  if (kv.v_pages.shape[0] != num_pages || kv.v_pages.shape[2] != P)
    fail("v_pages " + shape_str(kv.v_pages) + " must have the pages of k_pages " +
         shape_str(kv.k_pages) + " ([num_pages, Hkv, P, d] with the same num_pages and P)");
  if ((P & (P - 1)) != 0)
    fail("page size P = " + std::to_string(P) + " (k_pages " + shape_str(kv.k_pages) +
         ") must be a power of two");
  AttentionOptions o = opts;
  for (const auto& [name, sc, dst] : {std::tuple{"k_scales", &kv.k_scales, &o.k_scales},
                                      std::tuple{"v_scales", &kv.v_scales, &o.v_scales}}) {
    if (!*sc) continue;
    if ((*sc)->rank == 1) {
      *dst = **sc;
      continue;
    }
    check_view(name, **sc, 3, 3);
    if ((*sc)->shape[0] != num_pages)
      fail(std::string(name) + " " + shape_str(**sc) +
           " must be [num_pages, Hkv, P] with num_pages = " + std::to_string(num_pages) +
           " (k_pages " + shape_str(kv.k_pages) + ")");
    *dst = first_page(**sc, q.shape[0]);
  }
  return o;
}

// The block table (int32 [B, max_pages]) and the lengths (int32 or int64 [B]); neither, nor the
// pools, may share a byte with an output.
void check_table(const TensorView& q, const PagedKv& kv, const OutputView& out,
                 const AttentionOptions& opts) {
  const Extent eo = extent_of("out", out);
  const Extent el = opts.lse ? extent_of("lse", *opts.lse) : Extent{};
  const auto disjoint = [&](const char* name, const TensorView& t) {
    const Extent e = extent_of(name, t);
    check_disjoint("out", eo, {{name, e}});
    if (opts.lse) check_disjoint("lse", el, {{name, e}});
  };
  disjoint("k_pages", kv.k_pages);
  disjoint("v_pages", kv.v_pages);
  if (kv.k_scales) disjoint("k_scales", *kv.k_scales);
  if (kv.v_scales) disjoint("v_scales", *kv.v_scales);
  const std::int64_t B = q.shape[0];
  const TensorView& bt = kv.block_table;
  check_view("block_table", bt, 2, 2);
  if (bt.dtype != DType::i32)
    fail("block_table " + shape_str(bt) + " has dtype " + dtype_name(bt.dtype) +
         "; expected int32");
  if (bt.shape[0] != B)
    fail("block_table has shape " + shape_str(bt) + " but Q has B=" + std::to_string(B) +
         "; expected [" + std::to_string(B) + ", max_pages]");
  disjoint("block_table", bt);
  const TensorView& sl = kv.seq_lens;
  check_view("seq_lens", sl, 1, 1);
  if (sl.dtype != DType::i32 && sl.dtype != DType::i64)
    fail("seq_lens " + shape_str(sl) + " has dtype " + dtype_name(sl.dtype) +
         "; expected int32 or int64");
  if (sl.shape[0] != B)
    fail("seq_lens has shape " + shape_str(sl) + " but Q has B=" + std::to_string(B) +
         "; expected [" + std::to_string(B) + "]");
  disjoint("seq_lens", sl);
}

// Sequence b's length, and its table row's first ceil(len / P) entries in [0, num_pages).
std::int64_t sequence_length(const PagedKv& kv, std::int64_t b) {
  const TensorView &bt = kv.block_table, &sl = kv.seq_lens;
  const std::int64_t num_pages = kv.k_pages.shape[0], P = kv.k_pages.shape[2];
  const std::int64_t max_pages = bt.shape[1];
  const std::int64_t len = sl.dtype == DType::i32
                               ? static_cast<const std::int32_t*>(sl.data)[b * sl.strides[0]]
                               : static_cast<const std::int64_t*>(sl.data)[b * sl.strides[0]];
  if (len < 0 || len > max_pages * P)
    fail("seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
         " is outside [0, max_pages * P] = [0, " + std::to_string(max_pages * P) +
         "] (block_table " + shape_str(bt) + ", P = " + std::to_string(P) + ")");
  const std::int32_t* row = static_cast<const std::int32_t*>(bt.data) + b * bt.strides[0];
  for (std::int64_t i = 0; i < (len + P - 1) / P; ++i) {
    const std::int64_t page = row[i * bt.strides[1]];
    if (page < 0 || page >= num_pages)
      fail("block_table[" + std::to_string(b) + ", " + std::to_string(i) + "] = " +
           std::to_string(page) + " is outside [0, num_pages) = [0, " + std::to_string(num_pages) +
           ") (seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) + " uses its first " +
           std::to_string((len + P - 1) / P) + " entries)");
  }
  return len;
}

// Validates the call; with `paged`, also cuts it into one problem per sequence there (appended
// to its cleared vectors, whose capacity is kept: a steady-state call allocates nothing).
void validate_paged(const TensorView& q, const PagedKv& kv, const OutputView& out,
                    const AttentionOptions& opts, bool allow_f64, Paged* paged) {
  const AttentionOptions o = paged_options(q, kv, opts);
  const std::int64_t B = q.shape[0];
  const Problem whole =
      validate(q, first_page(kv.k_pages, B), first_page(kv.v_pages, B), out, o, allow_f64);
  check_table(q, kv, out, opts);
  const std::int64_t num_pages = kv.k_pages.shape[0], P = kv.k_pages.shape[2];
  int shift = 0;
  while ((std::int64_t{1} << shift) < P) ++shift;
  if (paged != nullptr) {
    paged->run.clear();
    paged->empty.clear();
  }
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = sequence_length(kv, b);
    if (paged == nullptr) continue;
    Problem p = whole;
    p.B = 1;
    p.Lk = len;
    p.q.data = advance(whole.q.data, whole.q.dtype, b * whole.q.s[0]);
    p.out = advance(whole.out, whole.out_dtype, b * whole.out_s[0]);
    if (whole.lse != nullptr) p.lse = advance(whole.lse, whole.lse_dtype, b * whole.lse_s[0]);
    if (whole.alibi != nullptr) p.alibi = whole.alibi + b * whole.alibi_bs;
    // Page to page: the pools' first strides (0 for a pool of one page, as validate() leaves
    // every dimension of size 1).
    p.k.s[0] = num_pages > 1 ? kv.k_pages.strides[0] : 0;
    p.v.s[0] = num_pages > 1 ? kv.v_pages.strides[0] : 0;
    if (kv.k_scales && kv.k_scales->rank == 3)
      p.k_scale_s[0] = num_pages > 1 ? kv.k_scales->strides[0] : 0;
    if (kv.v_scales && kv.v_scales->rank == 3)
      p.v_scale_s[0] = num_pages > 1 ? kv.v_scales->strides[0] : 0;
    // The table row is contiguous (check_view); a pool of one-token pages has s[2] = 0, unused.
    p.pages = static_cast<const std::int32_t*>(kv.block_table.data) + b * kv.block_table.strides[0];
    p.pages_s = 0;
    p.page_shift = shift;
    (len == 0 ? paged->empty : paged->run).push_back(p);
  }
}

}  // namespace

void check_paged(const TensorView& q, const PagedKv& kv, const OutputView& out,
                 const AttentionOptions& opts) {
  validate_paged(q, kv, out, opts, false, nullptr);
}

PagedProblems& paged_problems_of_this_thread() {
  static thread_local PagedProblems lists;
  return lists;
}

void run_paged(const TensorView& q, const PagedKv& kv, const OutputView& out,
               const AttentionOptions& opts, Context& ctx, PagedProblems& lists) {
  validate_paged(q, kv, out, opts, false, &lists);
  for (const Problem& p : lists.empty) write_empty(p);
  run_fast_set(lists.run.data(), lists.run.size(), ctx);
}

}  // namespace detail

void attention(const TensorView& q, const PagedKv& kv, const OutputView& out,
               const AttentionOptions& opts, Context* context) {
  detail::CallScope scope("attention_paged");
  Context& ctx = context != nullptr ? *context : default_context();
  // This thread's lists: a public call runs on its caller's thread, whose stack it owns until the
  // call returns (a step that an arena thread runs for another caller brings that caller's).
  detail::run_paged(q, kv, out, opts, ctx, detail::paged_problems_of_this_thread());
  scope.set_dtypes(q.dtype, kv.k_pages.dtype, out.dtype);
  if (scope.active()) {
    scope.record().shapes = "q:" + detail::dims_of(q) + ";k_pages:" + detail::dims_of(kv.k_pages) +
                            ";v_pages:" + detail::dims_of(kv.v_pages) +
                            ";block_table:" + detail::dims_of(kv.block_table);
  }
  scope.finish(ctx);
}

void reference_attention(const TensorView& q, const PagedKv& kv, const OutputView& out,
                         const AttentionOptions& opts) {
  detail::Paged paged;
  detail::validate_paged(q, kv, out, opts, true, &paged);
  for (const detail::Problem& p : paged.empty) detail::write_empty(p);
  for (const detail::Problem& p : paged.run) detail::run_reference(p);
}

}  // namespace cpuattn
