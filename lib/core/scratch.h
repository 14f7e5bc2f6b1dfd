// Working memory of kernels and drivers.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "core/inline.h"

namespace cpuattn::detail {

// Growable 64-byte-aligned float buffer. Grows only, so steady-state calls do not allocate.
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
  float* grow(std::size_t floats);
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> buf_;
  std::size_t capacity_ = 0;
};

}  // namespace cpuattn::detail
