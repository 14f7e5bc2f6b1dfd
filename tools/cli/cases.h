// Benchmark cases shared by `cpuattn bench` and `cpuattn profile`.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

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

// A dtype by name (cpuattn::parse_dtype): one of Q's (f32, bf16, f16), or with `kv` any K/V dtype
// of the library's list; throws std::invalid_argument naming `flag` and the choices.
DType parse_dtype(const std::string& text, const char* flag, bool kv);
// The short names parse_dtype() takes, in the list's order, and the same joined by ", ".
std::vector<std::string> dtype_names(bool kv);
std::string dtype_choices(bool kv);
// The short name parse_dtype() reads ("f32", "bf16", "f16", "int8", ...).
const char* short_dtype_name(DType t);

// What a bench case adds to the scores (AttentionOptions): nothing, soft-capping at 30, the
// standard ALiBi slopes, a sink logit per head, or all three.
enum class ScoreVariant { plain, softcap, alibi, sinks, all };
// "plain", "softcap", "alibi", "sinks" or "all"; throws std::invalid_argument naming --variant.
ScoreVariant parse_variant(const std::string& text);
const char* variant_name(ScoreVariant v);

// An attention case; inputs are 64-byte aligned and filled with a fixed pseudo-random pattern.
// Q and out are stored as `dtype`, K and V as `kv_dtype` (int8 with per-token scales, as a
// KvCache stores them); `bytes` counts K and V at their storage size.
// `variant` is named in the case's dims (" +softcap", ...).
Case attention_case(const Shape& s, DType dtype = DType::f32, DType kv_dtype = DType::f32,
                    ScoreVariant variant = ScoreVariant::plain);
// L1 (Linear), M1 (MHA layer) or M2 (MHA decode step); nullopt for any other name.
// M2's cache is stored as `kv_dtype`, its weights as `weights` (f32, or bf16 for bf16; the
// layer's activations stay f32).
std::optional<Case> layer_case(const std::string& name, DType kv_dtype = DType::f32,
                               DType weights = DType::f32);
// layer_case(name), else attention_case(parse_shape(name, causal), dtype, kv_dtype, variant).
// A variant other than plain on a layer case throws std::invalid_argument.
Case make_case(const std::string& name, bool causal, DType dtype = DType::f32,
               DType kv_dtype = DType::f32, ScoreVariant variant = ScoreVariant::plain);

}  // namespace cpuattn::cli
