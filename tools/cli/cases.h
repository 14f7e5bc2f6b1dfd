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

// Whether the cases made from now on put each buffer of 2 MiB or more that they allocate
// themselves (the attention shapes' Q, K, V and out; not the library's own caches) on 2
// MiB-aligned memory advised MADV_HUGEPAGE, as the read probe's is, so that a decoding step and
// the probe read the same kind of pages (`bench --huge-pages`, where the kernel grants
// transparent huge pages). Off by default: a framework's tensors are ordinary 64-byte-aligned
// allocations. Process-wide.
void set_huge_page_buffers(bool on);
bool huge_page_buffers();

// A part of a case's work as the roofline model sees it: `flops` on the FMA pipes, of which they
// can spend `fma_share` on the counted flops (attention's softmax runs on the same pipes;
// `fma_share_native` when the products ran as bf16 pairs, two multiply-adds a lane;
// `fma_share_tiles` when they ran on AMX tiles, beside the FMA pipes, which then carry the softmax
// alone), and `bytes` that must come from memory. It takes the longer of its FMA time and its read
// time.
struct WorkPart {
  double flops = 0, bytes = 0, fma_share = 1, fma_share_native = 1, fma_share_tiles = 1;
};

// How a case's products ran (active_bf16_path() of its context, for bf16 Q and K/V).
enum class Products { f32, pairs, tiles };
Products products_of(const std::string& bf16_path);

// One timed case: its work (FLOPs, and the bytes it must stream for memory-bound cases), the
// parts of that work for the model's limit, and a function that runs it once on a context.
// Inputs are made once per case, outside the timing.
struct Case {
  std::string name, dims;
  double flops = 0, bytes = 0;
  bool memory_bound = false;  // report GB/s against the read bandwidth as well
  std::function<void(Context&)> run;
  std::vector<WorkPart> parts;   // done one after another
  const char* layout = nullptr;  // attention cases: layout_name() of their inputs' layout
};

// Vector operations per attention score besides the products (max, subtract, exp, sum, scale
// and the conversions): they run on the FMA pipes.
inline constexpr double kSoftmaxOpsPerScore = 15;
// The share of the FMA pipes' work that is counted flops in attention with head dims D and Dv:
// per score D + Dv multiply-adds (half as many instructions as bf16 pairs: `pairs`) against
// kSoftmaxOpsPerScore other operations.
// With Products::tiles the products cost the FMA pipes nothing (an AMX tile product of 16 x 16
// scores and 32 dims takes 16 cycles of the tile unit: 1/16 cycle per score and 32 dims, against
// kSoftmaxOpsPerScore / 32 for the softmax on two 16-lane pipes).
double attention_fma_share(std::int64_t D, std::int64_t Dv, Products products = Products::f32);
// The model's time for `parts` at `peak_gflops` (f32 FMA) and `read_gbps`, in ms: each part the
// longer of its FMA and read times, the parts one after another, as `products` ran.
double limit_ms(const std::vector<WorkPart>& parts, double peak_gflops, double read_gbps,
                Products products);
// "fma", "bw" or "fma+bw": which bound sets the limit of each part (both kinds: a decode step's
// projections and its cache read).
std::string limit_kind(const std::vector<WorkPart>& parts, double peak_gflops, double read_gbps,
                       Products products);

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

// How a case's Q, K, V and out lie in memory: [B, H, L, D] (heads apart), or [B, L, H, D] (a
// projection's output before its heads are split, ONNX Runtime's MultiHeadAttention layout), the
// same logical tensors through strides (TensorView::blhd).
enum class Layout { bhld, blhd };
// "bhld" or "blhd"; throws std::invalid_argument naming --layout.
Layout parse_layout(const std::string& text);
const char* layout_name(Layout l);

// An attention case; inputs are 64-byte aligned and filled with a fixed pseudo-random pattern.
// Q and out are stored as `dtype`, K and V as `kv_dtype` (int8 with per-token scales, as a
// KvCache stores them); `bytes` counts K and V at their storage size.
// `variant` is named in the case's dims (" +softcap", ...), and so is the [B, L, H, D] layout.
Case attention_case(const Shape& s, DType dtype = DType::f32, DType kv_dtype = DType::f32,
                    ScoreVariant variant = ScoreVariant::plain, Layout layout = Layout::bhld);
// L1 (Linear), M1 (MHA layer) or M2 (MHA decode step); nullopt for any other name.
// M2's cache is stored as `kv_dtype`, its weights as `weights` (f32, or bf16 for bf16; the
// layer's activations stay f32).
std::optional<Case> layer_case(const std::string& name, DType kv_dtype = DType::f32,
                               DType weights = DType::f32);
// layer_case(name), else attention_case(parse_shape(name, causal), dtype, kv_dtype, variant,
// layout). A variant other than plain, or the [B, L, H, D] layout, on a layer case throws
// std::invalid_argument.
Case make_case(const std::string& name, bool causal, DType dtype = DType::f32,
               DType kv_dtype = DType::f32, ScoreVariant variant = ScoreVariant::plain,
               Layout layout = Layout::bhld);

}  // namespace cpuattn::cli
