// Working memory of kernels and drivers.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace cpuattn::detail {

// Growable 64-byte-aligned float buffer. Grows only, so steady-state calls do not allocate.
class Scratch {
 public:
  float* get(std::size_t floats) {
    if (floats > capacity_) {
      const std::size_t bytes = ((floats * sizeof(float) + 63) / 64) * 64;
      buf_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (!buf_) throw std::bad_alloc();
      capacity_ = bytes / sizeof(float);
    }
    return buf_.get();
  }
  float* data() const { return buf_.get(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t bytes() const { return capacity_ * sizeof(float); }
  void release() {
    buf_.reset();
    capacity_ = 0;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> buf_;
  std::size_t capacity_ = 0;
};

}  // namespace cpuattn::detail
