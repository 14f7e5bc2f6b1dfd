#include "alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_count{0}, g_aligned{0};

void count(std::atomic<long>& c) {
  if (g_counting.load(std::memory_order_relaxed)) c.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

namespace cpuattn::test {
#ifdef CPUATTN_TEST_TSAN
bool alloc_counter_active() { return false; }
#else
bool alloc_counter_active() { return true; }
#endif
void set_alloc_counting(bool on) { g_counting.store(on); }
long alloc_count() { return g_count.load(); }
long aligned_alloc_count() { return g_aligned.load(); }
}  // namespace cpuattn::test

#ifndef CPUATTN_TEST_TSAN
// The replacements pair malloc (and aligned_alloc) with free; GCC, inlining them, cannot see that
// they match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
void* aligned(std::size_t n, std::align_val_t a) noexcept {
  count(g_aligned);
  const auto al = static_cast<std::size_t>(a);
  // aligned_alloc wants a size that is a multiple of the alignment.
  return std::aligned_alloc(al, n == 0 ? al : (n + al - 1) / al * al);
}
}  // namespace
void* operator new(std::size_t n) {
  count(g_count);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return aligned(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return aligned(n, a);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif
