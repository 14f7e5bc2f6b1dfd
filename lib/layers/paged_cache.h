// PagedKvCache's storage, shared with MultiHeadAttention::decode (which checks a whole step before
// it appends to any sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpuattn/layers.h"

namespace cpuattn {

struct PagedKvCache::Storage {
  std::int64_t NP, P, Hkv, D, Dv;
  DType dtype;
  // The pools [NP, Hkv, P, D] and [NP, Hkv, P, Dv] of `dtype`, as bytes, a page every k_page
  // and v_page elements (page_stride); a scaled dtype's per-token scales [NP, Hkv, P], or its
  // static scales [Hkv] (KvScales).
  std::int64_t k_page, v_page;
  std::vector<std::uint8_t> k, v;
  std::vector<float> k_scale, v_scale;
  std::vector<float> k_static, v_static;
  bool per_token_scales() const { return needs_scales(dtype) && k_static.empty(); }
  std::vector<std::int32_t> refs;       // sequences holding each page
  std::vector<std::int32_t> free_list;  // pages with refs 0; taken from the back
  // A sequence holds ceil(length / P) pages, no more.
  struct Seq {
    std::vector<std::int32_t> pages;
    std::int64_t length = 0;
    bool live = false;
  };
  std::vector<Seq> seqs;
  std::vector<std::int32_t> table;  // batch(): [B, max_pages]
  std::vector<std::int64_t> lens;   // batch(): [B]

  Storage(std::int64_t num_pages, std::int64_t page_size, std::int64_t kv_heads,
          std::int64_t head_dim, std::int64_t value_dim, DType dtype, const KvScales& scales);
  static Storage& live(const std::unique_ptr<Storage>& s, const char* what);
  Seq& seq(std::int64_t id, const char* what);
  // Free pages that appending n tokens to s takes (with the copy of a shared last page).
  std::int64_t pages_needed(const Seq& s, std::int64_t n) const;
  // k or v of one append, [Hkv, n, width]: shape, dtype, no overlap with the pools, and (int8)
  // every value finite.
  void check_input(const char* name, const TensorView& t, std::int64_t width) const;
  // Appends checked input; pages_needed(s, n) pages must be free.
  void append_checked(Seq& s, const TensorView& k, const TensorView& v);

 private:
  std::int32_t take_page();
  void release(std::int32_t page);
  void copy_page(std::int32_t from, std::int32_t to);
  void store_rows(const Seq& s, std::int64_t first, const TensorView& t,
                  std::vector<std::uint8_t>& pool, std::int64_t page_elems,
                  std::vector<float>& scale, const std::vector<float>& head_scale,
                  std::int64_t width);
  friend class PagedKvCache;
};

}  // namespace cpuattn
