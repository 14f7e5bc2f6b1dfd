// Working memory of kernels and drivers.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "core/inline.h"

namespace cpuattn::detail {

// Growable 64-byte-aligned float buffer. Grows only, so steady-state calls do not allocate.
// The memory comes from the aligned operator new, which the tests' counting allocator sees
// (tests/alloc_counter.h): a call that grows a scratch buffer is an allocation there.
class Scratch {
 public:
  // The growth (and its std::bad_alloc) is out of line, in core/scratch.cpp: kernels call get()
  // from per-target code (see core/inline.h).
  CPUATTN_ALWAYS_INLINE float* get(std::size_t floats) {
    return floats <= capacity_ ? buf_.get() : grow(floats);
  }
  float* data() const { return buf_.get(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t bytes() const { return capacity_ * sizeof(float); }
  void release() {
    buf_.reset();
    capacity_ = 0;
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  float* grow(std::size_t floats);
  struct Free {
    void operator()(float* p) const { ::operator delete(p, kAlign); }
  };
  std::unique_ptr<float, Free> buf_;
  std::size_t capacity_ = 0;
};

}  // namespace cpuattn::detail
