// PagedKvCache: a pool of fixed-size pages shared by sequences, with reference-counted pages for
// copy-on-write prefix sharing. attention() reads the pool in place through batch()'s block table.
#include "layers/paged_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/checks.h"
#include "core/dtypes.h"
#include "cpuattn/layers.h"
#include "layers/cache_rows.h"

namespace cpuattn {

using detail::fail;
using detail::shape_str;

namespace {
// Pool sizes are checked so that no element offset overflows and the pool stays addressable.
constexpr std::int64_t kMaxPoolFloats = std::int64_t{1} << 40;

// The stride of a page of `elems` elements of `esize` bytes in its pool. A page whose bytes are
// an even number of 64-byte lines, 1 KiB or more, takes one line more: pages of a multiple of
// 4 KiB (vLLM's 16 tokens x 8 heads x 128 dims, of any dtype) would otherwise all start at the
// same L1 set, and a decode step reads one row of several pages at once (stream_runs-inl.h), so
// its rows of the same head and token would compete for one set's ways. An odd number of lines
// per page starts the pages at every line offset of a 4 KiB stretch (docs/performance.md
// #dm-page-stride). The line costs at most 1/16 of a page.
std::int64_t page_stride(std::int64_t elems, std::int64_t esize) {
  constexpr std::int64_t kLine = 64;
  const std::int64_t bytes = elems * esize;
  if (bytes < 1024 || bytes % (2 * kLine) != 0) return elems;
  return elems + kLine / esize;
}
}  // namespace

PagedKvCache::Storage::Storage(std::int64_t num_pages, std::int64_t page_size,
                               std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
                               DType dt, const KvScales& scales)
    : NP(num_pages), P(page_size), Hkv(kv_heads), D(head_dim), Dv(value_dim), dtype(dt) {
  check_cache_dtype("PagedKvCache", dtype);
  if (NP < 1 || NP > std::numeric_limits<std::int32_t>::max())
    fail("PagedKvCache: num_pages = " + std::to_string(NP) + " must be in [1, 2^31 - 1]");
  if (P < 1 || (P & (P - 1)) != 0)
    fail("PagedKvCache: page_size = " + std::to_string(P) + " must be a power of two");
  if (Hkv < 1 || D < 1 || Dv < 1)
    fail("PagedKvCache: kv_heads = " + std::to_string(Hkv) + ", head_dim = " + std::to_string(D) +
         ", value_dim = " + std::to_string(Dv) + " must all be >= 1");
  k_static = cache_scales("PagedKvCache", dtype, scales.k, "k", Hkv);
  v_static = cache_scales("PagedKvCache", dtype, scales.v, "v", Hkv);
  if (k_static.empty() != v_static.empty())
    fail(
        "PagedKvCache: scales.k and scales.v must both be given (static scales) or both be "
        "empty (per-token scales)");
  const std::int64_t width = std::max(D, Dv);
  const auto e = static_cast<std::int64_t>(dtype_size(dtype));
  if (P > kMaxPoolFloats / Hkv / width || NP > kMaxPoolFloats / page_stride(P * Hkv * width, e))
    fail("PagedKvCache: " + std::to_string(NP) + " pages of " + std::to_string(P) + " tokens x " +
         std::to_string(Hkv) + " heads x " + std::to_string(width) +
         " exceed the largest pool (2^40 elements)");
  k_page = page_stride(Hkv * P * D, e);
  v_page = page_stride(Hkv * P * Dv, e);
  k.resize(static_cast<std::size_t>(NP * k_page * e));
  v.resize(static_cast<std::size_t>(NP * v_page * e));
  if (per_token_scales()) {
    k_scale.resize(static_cast<std::size_t>(NP * Hkv * P));
    v_scale.resize(k_scale.size());
  }
  refs.assign(static_cast<std::size_t>(NP), 0);
  for (std::int64_t i = NP - 1; i >= 0; --i) free_list.push_back(static_cast<std::int32_t>(i));
}

PagedKvCache::Storage::Seq& PagedKvCache::Storage::seq(std::int64_t id, const char* what) {
  if (id < 0 || id >= static_cast<std::int64_t>(seqs.size()) ||
      !seqs[static_cast<std::size_t>(id)].live)
    fail(std::string("PagedKvCache::") + what + ": no sequence " + std::to_string(id));
  return seqs[static_cast<std::size_t>(id)];
}

std::int64_t PagedKvCache::Storage::pages_needed(const Seq& s, std::int64_t n) const {
  const std::int64_t have = static_cast<std::int64_t>(s.pages.size());
  std::int64_t need = (s.length + n + P - 1) / P - have;
  // Writing into a shared, partly filled last page copies it first.
  if (n > 0 && s.length % P != 0 && refs[static_cast<std::size_t>(s.pages.back())] > 1) ++need;
  return need;
}

std::int32_t PagedKvCache::Storage::take_page() {
  const std::int32_t page = free_list.back();
  free_list.pop_back();
  refs[static_cast<std::size_t>(page)] = 1;
  return page;
}

void PagedKvCache::Storage::release(std::int32_t page) {
  if (--refs[static_cast<std::size_t>(page)] == 0) free_list.push_back(page);
}

void PagedKvCache::Storage::check_input(const char* name, const TensorView& t,
                                        std::int64_t width) const {
  detail::check_view(name, t, 3, 3);
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
    fail(std::string("PagedKvCache::append: ") + name + " " + shape_str(t) + " has dtype " +
         dtype_name(t.dtype) + "; expected float32, bfloat16 or float16");
  if (t.shape[0] != Hkv || t.shape[2] != width)
    fail(std::string("PagedKvCache::append: ") + name + " " + shape_str(t) + " must be [" +
         std::to_string(Hkv) + ", n, " + std::to_string(width) + "] (kv_heads, tokens, " +
         (width == D && name[0] == 'k' ? "head_dim" : "value_dim") + ")");
  if (reinterpret_cast<std::uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
    fail(std::string("PagedKvCache::append: ") + name + ": data is not aligned to its elements");
  const detail::Extent e = detail::extent_of(name, t);
  const auto pool = [](const std::vector<std::uint8_t>& b) {
    const auto lo = reinterpret_cast<std::uintptr_t>(b.data());
    return detail::Extent{lo, lo + b.size()};
  };
  detail::check_disjoint("the cache's pool", pool(k), {{name, e}});
  detail::check_disjoint("the cache's pool", pool(v), {{name, e}});
  if (!needs_scales(dtype)) return;
  for (std::int64_t h = 0; h < Hkv; ++h)
    for (std::int64_t l = 0; l < t.shape[1]; ++l)
      for (std::int64_t d = 0; d < width; ++d) {
        const float x =
            detail::load_as_float(t.data, t.dtype, h * t.strides[0] + l * t.strides[1] + d);
        if (!std::isfinite(x))
          fail_not_storable("PagedKvCache::append", name,
                            std::to_string(h) + "," + std::to_string(l) + "," + std::to_string(d),
                            x, dtype);
      }
}

void PagedKvCache::Storage::copy_page(std::int32_t from, std::int32_t to) {
  const auto e = static_cast<std::int64_t>(dtype_size(dtype));
  const auto copy = [&](std::vector<std::uint8_t>& pool, std::int64_t stride, std::int64_t width) {
    std::memcpy(pool.data() + to * stride * e, pool.data() + from * stride * e,
                static_cast<std::size_t>(Hkv * P * width * e));
  };
  copy(k, k_page, D);
  copy(v, v_page, Dv);
  if (per_token_scales()) {
    std::copy_n(k_scale.begin() + from * Hkv * P, Hkv * P, k_scale.begin() + to * Hkv * P);
    std::copy_n(v_scale.begin() + from * Hkv * P, Hkv * P, v_scale.begin() + to * Hkv * P);
  }
}

void PagedKvCache::Storage::store_rows(const Seq& s, std::int64_t first, const TensorView& t,
                                       std::vector<std::uint8_t>& pool, std::int64_t page_elems,
                                       std::vector<float>& scale,
                                       const std::vector<float>& head_scale, std::int64_t width) {
  const auto e = static_cast<std::int64_t>(dtype_size(dtype));
  std::vector<float>& row = conversion_row(t.dtype == dtype ? 0 : width);
  for (std::int64_t l = 0; l < t.shape[1]; ++l) {
    const std::int64_t tok = first + l;
    const std::int64_t page = s.pages[static_cast<std::size_t>(tok / P)];
    for (std::int64_t h = 0; h < Hkv; ++h) {
      const std::int64_t src = h * t.strides[0] + l * t.strides[1];
      const std::int64_t in_page = h * P + tok % P;  // the row's index within its page
      const std::int64_t slot = page * Hkv * P + in_page;
      store_cache_row(t, src, pool.data() + (page * page_elems + in_page * width) * e, dtype, width,
                      scale.empty() ? nullptr : &scale[static_cast<std::size_t>(slot)],
                      head_scale.empty() ? 1.0f : head_scale[static_cast<std::size_t>(h)], row);
    }
  }
}

void PagedKvCache::Storage::append_checked(Seq& s, const TensorView& kt, const TensorView& vt) {
  const std::int64_t n = kt.shape[1];
  if (s.length % P != 0 && refs[static_cast<std::size_t>(s.pages.back())] > 1) {
    const std::int32_t copy = take_page();
    copy_page(s.pages.back(), copy);
    release(s.pages.back());
    s.pages.back() = copy;
  }
  while (static_cast<std::int64_t>(s.pages.size()) * P < s.length + n)
    s.pages.push_back(take_page());
  store_rows(s, s.length, kt, k, k_page, k_scale, k_static, D);
  store_rows(s, s.length, vt, v, v_page, v_scale, v_static, Dv);
  s.length += n;
}

PagedKvCache::PagedKvCache(std::int64_t num_pages, std::int64_t page_size, std::int64_t kv_heads,
                           std::int64_t head_dim, std::int64_t value_dim, DType dtype,
                           const KvScales& scales)
    : s_(std::make_unique<Storage>(num_pages, page_size, kv_heads, head_dim, value_dim, dtype,
                                   scales)) {}
PagedKvCache::~PagedKvCache() = default;
PagedKvCache::PagedKvCache(PagedKvCache&&) noexcept = default;
PagedKvCache& PagedKvCache::operator=(PagedKvCache&&) noexcept = default;

PagedKvCache::Storage& PagedKvCache::Storage::live(const std::unique_ptr<Storage>& s,
                                                   const char* what) {
  if (!s) fail(std::string("PagedKvCache::") + what + ": the cache was moved from");
  return *s;
}

std::int64_t PagedKvCache::num_pages() const { return Storage::live(s_, "num_pages").NP; }
std::int64_t PagedKvCache::page_size() const { return Storage::live(s_, "page_size").P; }
std::int64_t PagedKvCache::kv_heads() const { return Storage::live(s_, "kv_heads").Hkv; }
std::int64_t PagedKvCache::head_dim() const { return Storage::live(s_, "head_dim").D; }
std::int64_t PagedKvCache::value_dim() const { return Storage::live(s_, "value_dim").Dv; }
DType PagedKvCache::dtype() const { return Storage::live(s_, "dtype").dtype; }
std::int64_t PagedKvCache::free_pages() const {
  return static_cast<std::int64_t>(Storage::live(s_, "free_pages").free_list.size());
}

std::int64_t PagedKvCache::add_sequence() {
  Storage& st = Storage::live(s_, "add_sequence");
  for (std::size_t i = 0; i < st.seqs.size(); ++i) {
    if (!st.seqs[i].live) {
      st.seqs[i] = Storage::Seq{{}, 0, true};
      return static_cast<std::int64_t>(i);
    }
  }
  st.seqs.push_back(Storage::Seq{{}, 0, true});
  return static_cast<std::int64_t>(st.seqs.size()) - 1;
}

std::int64_t PagedKvCache::fork(std::int64_t seq, std::optional<std::int64_t> length) {
  Storage& st = Storage::live(s_, "fork");
  const Storage::Seq& from = st.seq(seq, "fork");
  const std::int64_t len = length.value_or(from.length);
  if (len < 0 || len > from.length)
    fail("PagedKvCache::fork: length " + std::to_string(len) + " is outside [0, " +
         std::to_string(from.length) + "] (sequence " + std::to_string(seq) + ")");
  const std::vector<std::int32_t> shared(from.pages.begin(),
                                         from.pages.begin() + (len + st.P - 1) / st.P);
  const std::int64_t id = add_sequence();  // may reallocate st.seqs: `from` is not used after it
  for (const std::int32_t page : shared) ++st.refs[static_cast<std::size_t>(page)];
  st.seqs[static_cast<std::size_t>(id)].pages = shared;
  st.seqs[static_cast<std::size_t>(id)].length = len;
  return id;
}

void PagedKvCache::append(std::int64_t seq, const TensorView& k, const TensorView& v) {
  Storage& st = Storage::live(s_, "append");
  Storage::Seq& s = st.seq(seq, "append");
  st.check_input("k", k, st.D);
  st.check_input("v", v, st.Dv);
  if (v.shape[1] != k.shape[1])
    fail("PagedKvCache::append: k " + shape_str(k) + " and v " + shape_str(v) +
         " must hold the same number of tokens");
  const std::int64_t need = st.pages_needed(s, k.shape[1]);
  if (need > static_cast<std::int64_t>(st.free_list.size()))
    fail("PagedKvCache::append: sequence " + std::to_string(seq) + " (" + std::to_string(s.length) +
         " tokens) needs " + std::to_string(need) + " more pages for " +
         std::to_string(k.shape[1]) + " tokens but " + std::to_string(st.free_list.size()) +
         " of " + std::to_string(st.NP) + " are free");
  st.append_checked(s, k, v);
}

void PagedKvCache::truncate(std::int64_t seq, std::int64_t length) {
  Storage& st = Storage::live(s_, "truncate");
  Storage::Seq& s = st.seq(seq, "truncate");
  if (length < 0 || length > s.length)
    fail("PagedKvCache::truncate: length " + std::to_string(length) + " is outside [0, " +
         std::to_string(s.length) + "] (sequence " + std::to_string(seq) + ")");
  const auto keep = static_cast<std::size_t>((length + st.P - 1) / st.P);
  for (std::size_t i = keep; i < s.pages.size(); ++i) st.release(s.pages[i]);
  s.pages.resize(keep);
  s.length = length;
}

void PagedKvCache::free(std::int64_t seq) {
  Storage& st = Storage::live(s_, "free");
  Storage::Seq& s = st.seq(seq, "free");
  for (const std::int32_t page : s.pages) st.release(page);
  s = Storage::Seq{};
}

std::int64_t PagedKvCache::length(std::int64_t seq) const {
  return Storage::live(s_, "length").seq(seq, "length").length;
}

std::vector<std::int32_t> PagedKvCache::pages(std::int64_t seq) const {
  return Storage::live(s_, "pages").seq(seq, "pages").pages;
}

PagedKv PagedKvCache::batch(const std::vector<std::int64_t>& seqs) {
  Storage& st = Storage::live(s_, "batch");
  if (seqs.empty()) fail("PagedKvCache::batch: no sequences given");
  std::int64_t max_pages = 1;
  for (const std::int64_t id : seqs)
    max_pages = std::max<std::int64_t>(max_pages, st.seq(id, "batch").pages.size());
  const auto B = static_cast<std::int64_t>(seqs.size());
  st.table.assign(static_cast<std::size_t>(B * max_pages), -1);
  st.lens.resize(seqs.size());
  for (std::int64_t b = 0; b < B; ++b) {
    const Storage::Seq& s = st.seqs[static_cast<std::size_t>(seqs[static_cast<std::size_t>(b)])];
    std::copy(s.pages.begin(), s.pages.end(), st.table.begin() + b * max_pages);
    st.lens[static_cast<std::size_t>(b)] = s.length;
  }
  PagedKv kv;
  kv.k_pages = key_pages();
  kv.v_pages = value_pages();
  kv.block_table = TensorView::contiguous(st.table.data(), DType::i32, {B, max_pages});
  kv.seq_lens = TensorView::contiguous(st.lens.data(), DType::i64, {B});
  kv.k_scales = key_page_scales();
  kv.v_scales = value_page_scales();
  return kv;
}

TensorView PagedKvCache::key_pages() const {
  const Storage& st = Storage::live(s_, "key_pages");
  TensorView t = TensorView::contiguous(st.k.data(), st.dtype, {st.NP, st.Hkv, st.P, st.D});
  t.strides[0] = st.k_page;
  return t;
}

TensorView PagedKvCache::value_pages() const {
  const Storage& st = Storage::live(s_, "value_pages");
  TensorView t = TensorView::contiguous(st.v.data(), st.dtype, {st.NP, st.Hkv, st.P, st.Dv});
  t.strides[0] = st.v_page;
  return t;
}

std::optional<TensorView> PagedKvCache::key_page_scales() const {
  const Storage& st = Storage::live(s_, "key_page_scales");
  if (!needs_scales(st.dtype)) return std::nullopt;
  if (!st.per_token_scales()) return f32_view(st.k_static.data(), {st.Hkv});
  return f32_view(st.k_scale.data(), {st.NP, st.Hkv, st.P});
}

std::optional<TensorView> PagedKvCache::value_page_scales() const {
  const Storage& st = Storage::live(s_, "value_page_scales");
  if (!needs_scales(st.dtype)) return std::nullopt;
  if (!st.per_token_scales()) return f32_view(st.v_static.data(), {st.Hkv});
  return f32_view(st.v_scale.data(), {st.NP, st.Hkv, st.P});
}

}  // namespace cpuattn
