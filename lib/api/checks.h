// Argument checks shared by every public entry point (attention, layers, positional encodings).
// Each throws cpuattn::Error with a message that names the argument and its shape.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

std::string shape_str(const TensorView& t);
// "Q [2,8,128,32], K [2,8,128,64]" for a message tail.
std::string shapes_of(std::initializer_list<std::pair<const char*, const TensorView*>> ts);
[[noreturn]] void fail(const std::string& what);

// The byte range [lo, hi) a view can touch. Computing it also proves that no offset overflows.
struct Extent {
  std::uintptr_t lo = 0, hi = 0;
};
Extent extent_of(const char* name, const TensorView& t);

// Present, rank in [min_rank, max_rank], sizes >= 1, strides >= 0, last dimension contiguous.
void check_view(const char* name, const TensorView& t, int min_rank, int max_rank);
// f32 (or f64 when allowed).
void check_dtype(const char* name, const TensorView& t, bool allow_f64);
// An output must not write one element twice.
void check_no_self_overlap(const char* name, const TensorView& t);
// An output's bytes must not overlap any of `others`.
void check_disjoint(const char* out_name, const Extent& o,
                    std::initializer_list<std::pair<const char*, Extent>> others);

}  // namespace cpuattn::detail
