// Helpers shared by the fuzz targets: a reader that turns the fuzzer's bytes into decisions, and
// a check that aborts with a message (libFuzzer then saves the input as a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Aborts with the condition, place and a printf-style explanation. abort() is what libFuzzer
// catches as a crash ("deadly signal") and what the corpus replay reports as a failed test.
#define FUZZ_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "\nFUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                       \
      std::fprintf(stderr, "\n");                                                              \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace cpuattn::fuzz {

// Reads decisions from the fuzzer's bytes, front to back. Past the end every read gives 0, so
// every input (the empty one too) is a complete program, and a mutation of one byte changes one
// decision instead of shifting a parse. Decisions whose 0 is the simplest choice (the smallest
// size, no option) keep short inputs simple.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : p_(data), end_(data + size) {}

  std::uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  std::uint64_t bits(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{u8()} << (8 * i);
    return v;
  }
  // A value in [lo, hi] (hi - lo < 2^32), from as few bytes as the range needs.
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    const std::uint64_t raw = span <= 256 ? u8() : span <= 65536 ? bits(2) : bits(4);
    return lo + static_cast<std::int64_t>(raw % span);
  }
  // True with probability about percent / 100 (false once the input is used up).
  bool chance(int percent) { return u8() * 100 >= (100 - percent) * 256; }
  template <class T, std::size_t N>
  const T& pick(const T (&options)[N]) {
    return options[static_cast<std::size_t>(range(0, N - 1))];
  }
  bool empty() const { return p_ >= end_; }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

}  // namespace cpuattn::fuzz
