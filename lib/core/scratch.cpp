#include "core/scratch.h"

#include <cstdint>
#include <new>

namespace cpuattn::detail {

float* Scratch::grow(std::size_t floats) {
  // A count whose byte size overflows is refused before anything changes: the buffer is kept.
  if (floats > (SIZE_MAX - 63) / sizeof(float)) throw std::bad_alloc();
  const std::size_t bytes = ((floats * sizeof(float) + 63) / 64) * 64;
  // The old buffer goes first (no point keeping both); a failed allocation leaves it empty, never
  // with a capacity and no memory.
  buf_.reset(static_cast<float*>(::operator new(bytes, kAlign, std::nothrow)));
  capacity_ = 0;
  if (!buf_) throw std::bad_alloc();
  capacity_ = bytes / sizeof(float);
  return buf_.get();
}

}  // namespace cpuattn::detail
