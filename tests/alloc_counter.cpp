#include "alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_count{0};
}  // namespace

namespace cpuattn::test {
#ifdef CPUATTN_TEST_TSAN
bool alloc_counter_active() { return false; }
#else
bool alloc_counter_active() { return true; }
#endif
void set_alloc_counting(bool on) { g_counting.store(on); }
long alloc_count() { return g_count.load(); }
}  // namespace cpuattn::test

#ifndef CPUATTN_TEST_TSAN
// The replacements pair malloc with free; GCC, inlining them, cannot see that they match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif
