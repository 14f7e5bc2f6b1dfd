// The K rows a streamed block's scores read next, prefetched while P V of the current block runs
// (BlockPath::k_ahead).
//
// A streamed decode task reads each block's K and V from memory once: the scores read K, then
// P V reads V. With V rows prefetched beside their K rows in the scores and the next block's K
// rows prefetched during P V, each phase asks for as many bytes as the other consumes and the
// memory stays busy through both; with the next K asked for by the scores as well, P V had
// nothing in flight (docs/performance.md#dm-k-ahead-in-pv). P V issues the rows in shares as it
// goes through the block (Share), not all at once.
#pragma once

#include <cstdint>

#include "core/inline.h"
#include "simd/prefetch.h"

namespace cpuattn::detail {

struct KeyAhead {
  const char* first = nullptr;  // row t at first + t * stride, `bytes` long, for t < rows
  std::int64_t rows = 0, stride = 0, bytes = 0;

  // Share i of `shares` equal shares of the rows, into L2 (prefetcht2, as the scores' own V
  // prefetches of paged runs: docs/performance.md#dm-runs-prefetcht2).
  CPUATTN_ALWAYS_INLINE void Share(std::int64_t i, std::int64_t shares) const {
    for (std::int64_t t = rows * i / shares; t < rows * (i + 1) / shares; ++t)
      for (std::int64_t off = 0; off < bytes; off += 64) Prefetch<1>(first + t * stride + off);
  }
};

// What a streamed block's score loop asks for beside the K rows it reads (DotScoresR): the V rows
// of the same keys (v + j * v_stride, v_bytes long; nothing without v), and with them the K rows
// 16 keys ahead among the k_valid keys that exist from the loop's first key on. V goes into L1
// (prefetcht0), or with v_l2 into L2 (prefetcht2), where P V, which reads it a block later, still
// finds it (BlockPath::v_ahead_l2: Intel, docs/performance.md#dm-decode-v-prefetch-l2).
struct ScoresAhead {
  const char* v = nullptr;
  std::int64_t v_stride = 0, v_bytes = 0, k_valid = 0;
  bool v_l2 = false;
};

}  // namespace cpuattn::detail
