// Memory for tensor views, fenced by PROT_NONE pages so that any access outside the bytes a view
// may touch faults at once (ASan reports the SEGV with its stack), plus the arithmetic of a
// view's extent done independently of the library.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpuattn/cpuattn.h"

namespace cpuattn::fuzz {

inline std::size_t page_size() {
  static const std::size_t n = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return n;
}
inline std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

// What a view can touch: the byte offsets of its elements from `data`, bounded by `bytes`, and
// whether computing that overflowed 64 bits. Only meaningful for a view with rank 1..4,
// sizes >= 1 and strides >= 0 (`sane`); the library rejects every other view before this matters.
struct Extent {
  bool sane = false;
  bool overflow = false;
  std::uint64_t bytes = 0;     // (largest element offset + 1) * element size
  std::uint64_t elements = 0;  // product of the sizes (0 if it overflows)
  bool last_is_max = false;    // the largest element offset is exactly INT64_MAX
};

inline Extent extent_of(int rank, const std::int64_t* shape, const std::int64_t* strides,
                        std::size_t esize) {
  Extent e;
  e.sane = rank >= 1 && rank <= kMaxRank;
  for (int d = 0; e.sane && d < rank; ++d) e.sane = shape[d] >= 1 && strides[d] >= 0;
  if (!e.sane) return e;
  std::int64_t last = 0, count = 1, term = 0, bytes = 0;
  for (int d = 0; d < rank; ++d) {
    e.overflow = e.overflow || __builtin_mul_overflow(shape[d] - 1, strides[d], &term) ||
                 __builtin_add_overflow(last, term, &last) ||
                 __builtin_mul_overflow(count, shape[d], &count);
  }
  e.last_is_max = !e.overflow && last == std::numeric_limits<std::int64_t>::max();
  std::int64_t end = 0;  // last + 1, which overflows when last is INT64_MAX
  e.overflow = e.overflow || __builtin_add_overflow(last, 1, &end) ||
               __builtin_mul_overflow(end, static_cast<std::int64_t>(esize), &bytes);
  if (!e.overflow) {
    e.bytes = static_cast<std::uint64_t>(bytes);
    e.elements = static_cast<std::uint64_t>(count);
  }
  return e;
}

// Calls f(byte offset) for every element of a sane view, in row-major order of the indices.
template <class F>
void for_each_offset(int rank, const std::int64_t* shape, const std::int64_t* strides,
                     std::size_t esize, F&& f) {
  std::int64_t idx[kMaxRank] = {0, 0, 0, 0};
  for (;;) {
    std::int64_t off = 0;
    for (int d = 0; d < rank; ++d) off += idx[d] * strides[d];
    f(static_cast<std::uint64_t>(off) * esize);
    int d = rank - 1;
    while (d >= 0 && ++idx[d] == shape[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

// One private mapping: PROT_NONE guard pages around the usable bytes [data, data + bytes).
// Dense: every page between the guards is readable and writable, and `data` sits right against
// the upper guard (at_end) or right after the lower one. Sparse: for views that are huge but
// touch few elements (large strides), only the pages holding an element are accessible.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { release(); }

  // Returns nullptr if the kernel refuses the mapping.
  unsigned char* dense(std::uint64_t bytes, bool at_end, unsigned char fill) {
    bytes = std::max<std::uint64_t>(bytes, 1);
    const std::uint64_t page = page_size(), inner = round_up(bytes, page);
    if (!reserve(inner + 2 * page, PROT_READ | PROT_WRITE)) return nullptr;
    ::mprotect(base_, page, PROT_NONE);
    ::mprotect(base_ + page + inner, page, PROT_NONE);
    std::memset(base_ + page, fill, inner);
    lo_ = base_ + page;
    hi_ = lo_ + inner;
    data_ = at_end ? hi_ - bytes : lo_;
    return data_;
  }

  // `offsets` are the byte offsets of the elements (each esize bytes) from the returned pointer.
  unsigned char* sparse(std::uint64_t bytes, const std::vector<std::uint64_t>& offsets,
                        std::size_t esize, unsigned char fill) {
    const std::uint64_t page = page_size(), inner = round_up(bytes, page);
    if (!reserve(inner + 2 * page, PROT_NONE)) return nullptr;
    lo_ = base_ + page;
    hi_ = lo_ + inner;
    data_ = hi_ - bytes;  // bytes is a multiple of esize, so data stays esize-aligned
    std::vector<std::uint64_t> pages;
    for (std::uint64_t off : offsets) {
      const std::uint64_t first = (data_ - lo_ + off) / page;
      const std::uint64_t last = (data_ - lo_ + off + esize - 1) / page;
      for (std::uint64_t p = first; p <= last; ++p) pages.push_back(p);
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    for (std::size_t i = 0; i < pages.size();) {
      std::size_t j = i + 1;
      while (j < pages.size() && pages[j] == pages[j - 1] + 1) ++j;
      unsigned char* start = lo_ + pages[i] * page;
      if (::mprotect(start, (j - i) * page, PROT_READ | PROT_WRITE) != 0) {
        release();  // a refused mapping holds nothing, as one whose reserve() failed
        return nullptr;
      }
      std::memset(start, fill, (j - i) * page);
      runs_.emplace_back(start, (j - i) * page);
      i = j;
    }
    return data_;
  }

  // Inputs become read-only once filled: a library write into an input faults.
  void make_read_only() {
    if (runs_.empty()) {
      ::mprotect(lo_, hi_ - lo_, PROT_READ);
    } else {
      for (auto [start, len] : runs_) ::mprotect(start, len, PROT_READ);
    }
  }

  bool is_sparse() const { return !runs_.empty(); }
  unsigned char* data() const { return data_; }
  // The accessible bytes (dense: the whole inner region, including bytes outside the view).
  unsigned char* lo() const { return lo_; }
  unsigned char* hi() const { return hi_; }

 private:
  // A Mapping holds one reservation: a second one replaces (and unmaps) the first.
  bool reserve(std::uint64_t len, int prot) {
    release();
    void* p = ::mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    base_ = static_cast<unsigned char*>(p);
    len_ = len;
    return true;
  }

  void release() {
    if (base_ != nullptr) ::munmap(base_, len_);
    base_ = lo_ = hi_ = data_ = nullptr;
    len_ = 0;
    runs_.clear();
  }

  unsigned char* base_ = nullptr;
  std::uint64_t len_ = 0;
  unsigned char *lo_ = nullptr, *hi_ = nullptr, *data_ = nullptr;
  std::vector<std::pair<unsigned char*, std::uint64_t>> runs_;  // sparse: accessible runs
};

}  // namespace cpuattn::fuzz
