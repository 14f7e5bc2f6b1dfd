// Counts global operator new calls, for the tests that prove a steady-state call allocates
// nothing. A test executable gets the counter by linking alloc_counter.cpp (cpuattn_alloc_counter()
// in tests/CMakeLists.txt), which replaces the global operator new, plain and aligned: the
// kernels' scratch buffers come from the aligned one (core/scratch.h), the rest from the plain
// one. ThreadSanitizer's runtime defines operator new itself, so under it nothing is replaced and
// the counting tests skip.
#pragma once

#include <gtest/gtest.h>

namespace cpuattn::test {

// Whether operator new is counted in this build (false under ThreadSanitizer).
bool alloc_counter_active();
void set_alloc_counting(bool on);
long alloc_count();          // plain operator new calls
long aligned_alloc_count();  // aligned (std::align_val_t) operator new calls

struct Allocations {
  long plain = 0, aligned = 0;
  long all() const { return plain + aligned; }
  // What a steady-state call on `threads` threads may not allocate. One thread runs every task
  // itself, so after warm-up calls nothing, scratch (aligned) included. With more, which thread
  // first runs a task of a size is oneTBB's choice, and that task grows the thread's scratch
  // (docs/guarantees.md#memory): there only the plain operator new counts.
  long steady_state(int threads) const { return threads == 1 ? all() : plain; }
};

// operator new calls while f runs.
template <class F>
Allocations allocations_during(F&& f) {
  set_alloc_counting(false);
  const Allocations before{alloc_count(), aligned_alloc_count()};
  set_alloc_counting(true);
  f();
  set_alloc_counting(false);
  return {alloc_count() - before.plain, aligned_alloc_count() - before.aligned};
}

}  // namespace cpuattn::test

// First statement of a test that counts allocations.
#define CPUATTN_SKIP_WITHOUT_ALLOC_COUNTER()                                            \
  do {                                                                                  \
    if (!::cpuattn::test::alloc_counter_active())                                       \
      GTEST_SKIP() << "ThreadSanitizer's operator new: nothing counts the allocations"; \
  } while (0)
