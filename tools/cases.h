// Benchmark cases shared by `cpuattn bench` and `cpuattn profile`.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "cpuattn/cpuattn.h"
#include "shapes.h"

namespace cpuattn::cli {

using Shape = bench::Shape;

// A named shape (S1, P1, ...) or "B,H,Lq,Lk,D[,Hkv[,Dv]]"; `causal` makes it causal (top-left).
// Throws std::invalid_argument naming the text.
Shape parse_shape(const std::string& text, bool causal);

// One timed case: its work (FLOPs, and the bytes it must stream for memory-bound cases) and a
// function that runs it once on a context. Inputs are made once per case, outside the timing.
struct Case {
  std::string name, dims;
  double flops = 0, bytes = 0;
  bool memory_bound = false;  // report GB/s against the read bandwidth as well
  std::function<void(Context&)> run;
};

// An attention case; inputs are 64-byte aligned and filled with a fixed pseudo-random pattern.
Case attention_case(const Shape& s);
// L1 (Linear), M1 (MHA layer) or M2 (MHA decode step); nullopt for any other name.
std::optional<Case> layer_case(const std::string& name);
// layer_case(name), else attention_case(parse_shape(name, causal)).
Case make_case(const std::string& name, bool causal);

}  // namespace cpuattn::cli
