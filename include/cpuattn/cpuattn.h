// cpuattn: fast, multithreaded CPU attention.
//
//   out = softmax(scale * Q K^T + M) V        for every batch b and query head h
//
// Shapes (logical; memory layout is given by strides, see TensorView):
//   Q   [B, H,   Lq, D]      K [B, Hkv, Lk, D]      V [B, Hkv, Lk, Dv]
//   out [B, H,   Lq, Dv]     lse [B, H, Lq]         weights [B, H, Lq, Lk]
// H must be a multiple of Hkv: query head h reads K/V head h / (H / Hkv) (grouped-query
// attention; Hkv == 1 is multi-query attention). Dv may differ from D.
//
// Masks (all optional; they combine, a key is attended only if every mask allows it):
//   * causal top-left:      query i sees keys j <= i
//   * causal bottom-right:  query i sees keys j <= i + Lk - Lq (KV-cache decoding)
//   * boolean mask:         true = may attend; broadcastable to [B, H, Lq, Lk] (numpy rules)
//   * additive float mask:  added to the scaled scores; broadcastable to [B, H, Lq, Lk]
//   * key lengths [B]:      keys at positions >= key_lengths[b] are masked (padded batches)
// A row whose every key is masked gives out = 0 and lse = -inf (weights 0). An additive mask of
// finite values (e.g. -1e9) is plain arithmetic: a row that is -1e9 everywhere averages V.
// NaN or Inf in the inputs only affect the rows they reach (the fast path also lets a NaN or
// Inf in V at a masked key, or a +inf score under an additive -inf, make that row NaN).
//
// Every entry point validates all arguments before it writes anything: on bad input it throws
// cpuattn::Error, whose message names the argument and the shapes, and leaves outputs untouched.
//
// This header is plain C++20: no SIMD library or threading library types appear in it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cpuattn/export.h"

namespace cpuattn {

namespace detail {
struct ContextAccess;
}

// Thrown for every invalid argument. The message starts with "cpuattn: ".
class CPUATTN_API Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Element types, one line each: enumerator, bytes, name (as NumPy and PyTorch spell it), short
// name (the CLI's and Python's dtype strings) and role:
//   tensor   Q, K, V, out and KV caches (the reference also takes f64 Q, K, V, out)
//   scaled   K, V and KV caches only, with scales: the value is float(element) * scale
//            (AttentionOptions::k_scales / v_scales)
//   other    masks (boolean), lengths and offsets (i32, i64), the reference's f64
// Validation, the kernels' dispatch (lib/kv/), the C API, Python and the tests all read this
// list: a new K/V element type is one line here and one file in lib/kv/ (docs/architecture.md).
// bf16 and f16 are stored as their 16-bit patterns, fp8_e4m3 (OCP FP8 E4M3, PyTorch's
// float8_e4m3fn: no infinities, NaN 0x7f / 0xff, largest finite 448) as its byte, boolean as one
// byte (0 = false).
#define CPUATTN_DTYPES(X)                             \
  X(f32, 4, "float32", "f32", tensor)                 \
  X(f64, 8, "float64", "f64", other)                  \
  X(bf16, 2, "bfloat16", "bf16", tensor)              \
  X(f16, 2, "float16", "f16", tensor)                 \
  X(boolean, 1, "bool", "bool", other)                \
  X(i32, 4, "int32", "i32", other)                    \
  X(i64, 8, "int64", "i64", other)                    \
  X(i8, 1, "int8", "int8", scaled)                    \
  X(fp8_e4m3, 1, "float8_e4m3fn", "fp8_e4m3", scaled) \
  /* a new dtype goes on a line above this one */

enum class DType : std::uint8_t {
#define CPUATTN_DTYPE_ENUMERATOR(name, bytes, long_name, short_name, role) name,
  CPUATTN_DTYPES(CPUATTN_DTYPE_ENUMERATOR)
#undef CPUATTN_DTYPE_ENUMERATOR
};

enum class DTypeRole : std::uint8_t { tensor, scaled, other };

inline constexpr int kNumDTypes = 0
#define CPUATTN_DTYPE_COUNT(name, bytes, long_name, short_name, role) +1
    CPUATTN_DTYPES(CPUATTN_DTYPE_COUNT)
#undef CPUATTN_DTYPE_COUNT
    ;

CPUATTN_API const char* dtype_name(DType dtype);
// The short name ("f32", "bf16", "int8", ...), and the dtype named by its enumerator ("i8"), short
// or long name; false for an unknown name.
CPUATTN_API const char* dtype_short_name(DType dtype);
CPUATTN_API bool parse_dtype(const std::string& name, DType& out);

// Bytes per element (0 for a value outside the enum).
constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
#define CPUATTN_DTYPE_SIZE(name, bytes, long_name, short_name, role) \
  case DType::name:                                                  \
    return bytes;
    CPUATTN_DTYPES(CPUATTN_DTYPE_SIZE)
#undef CPUATTN_DTYPE_SIZE
  }
  return 0;
}

constexpr DTypeRole dtype_role(DType dtype) {
  switch (dtype) {
#define CPUATTN_DTYPE_ROLE(name, bytes, long_name, short_name, role) \
  case DType::name:                                                  \
    return DTypeRole::role;
    CPUATTN_DTYPES(CPUATTN_DTYPE_ROLE)
#undef CPUATTN_DTYPE_ROLE
  }
  return DTypeRole::other;
}

// K, V and KV caches may have this dtype (the tensor and scaled roles).
constexpr bool is_kv_dtype(DType dtype) { return dtype_role(dtype) != DTypeRole::other; }
// K or V of this dtype need scales (AttentionOptions::k_scales / v_scales).
constexpr bool needs_scales(DType dtype) { return dtype_role(dtype) == DTypeRole::scaled; }

// Conversions as the library performs them: f32 -> bf16 and f32 -> f16 round to nearest even
// (f16 overflows to inf; NaN stays NaN); bf16/f16 -> f32 are exact.
CPUATTN_API std::uint16_t to_bf16(float x);
CPUATTN_API float from_bf16(std::uint16_t bits);
CPUATTN_API std::uint16_t to_f16(float x);
CPUATTN_API float from_f16(std::uint16_t bits);
// Symmetric int8 quantization of one row of n values (one token of one K/V head, as KvCache
// stores it): scale = max|x| / 127 (0 for a row of zeros), q[i] = round-half-even(x[i] / scale);
// the value computed with is float(q[i]) * scale. Returns the scale. Throws Error (writing
// nothing) when a value is NaN or infinite, which int8 cannot hold.
CPUATTN_API float quantize_int8(const float* x, std::int64_t n, std::int8_t* q);

inline constexpr int kMaxRank = 4;

// A non-owning strided view of up to 4 dimensions. Strides count elements, not bytes.
// P is `const void` for inputs (TensorView) and `void` for outputs (OutputView).
template <class P>
struct BasicView {
  P* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};

  // Row-major (C order) view of `shape`.
  static BasicView contiguous(P* data, DType dtype, std::initializer_list<std::int64_t> shape) {
    BasicView t;
    t.data = data;
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    int i = 0;
    for (std::int64_t s : shape) {
      if (i < kMaxRank) t.shape[i] = s;
      ++i;
    }
    std::int64_t stride = 1;
    for (int d = (t.rank < kMaxRank ? t.rank : kMaxRank) - 1; d >= 0; --d) {
      t.strides[d] = stride;
      stride *= t.shape[d];
    }
    return t;
  }

  // Row-major view of a shape known only at run time (rank 0..4).
  static BasicView contiguous(P* data, DType dtype, const std::int64_t* shape, int rank) {
    BasicView t;
    t.data = data;
    t.dtype = dtype;
    t.rank = rank;
    std::int64_t stride = 1;
    for (int d = (rank < kMaxRank ? rank : kMaxRank) - 1; d >= 0; --d) {
      t.shape[d] = shape[d];
      t.strides[d] = stride;
      stride *= shape[d];
    }
    return t;
  }

  // Logical [B, H, L, D] view of memory laid out as [B, L, H, D] (the layout of a projection's
  // output before heads are split): no copy, only strides.
  static BasicView blhd(P* data, DType dtype, std::int64_t B, std::int64_t L, std::int64_t H,
                        std::int64_t D) {
    BasicView t;
    t.data = data;
    t.dtype = dtype;
    t.rank = 4;
    t.shape = {B, H, L, D};
    t.strides = {L * H * D, D, H * D, 1};
    return t;
  }

  // An output view converts to an input view, never the other way round.
  template <class Q = P>
  requires(!std::is_const_v<Q>) operator BasicView<const Q>() const {
    BasicView<const void> t;
    t.data = data;
    t.dtype = dtype;
    t.rank = rank;
    t.shape = shape;
    t.strides = strides;
    return t;
  }
};

using TensorView = BasicView<const void>;
using OutputView = BasicView<void>;

// Shorthand for contiguous f32 tensors, the common case.
inline TensorView f32_view(const float* data, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(data, DType::f32, shape);
}
inline OutputView f32_view(float* data, std::initializer_list<std::int64_t> shape) {
  return OutputView::contiguous(data, DType::f32, shape);
}

enum class Causal : std::uint8_t { none, top_left, bottom_right };

// The scales every entry point accepts: float32's smallest normal number, and the largest
// float32 whose product with log2(e) (which the fast path folds into the scale) is finite.
inline constexpr double kMinScale = 1.1754943508222875e-38;
inline constexpr double kMaxScale = 2.3586574e38;

struct AttentionOptions {
  // Multiplies Q K^T. Default 1/sqrt(D). Must be in [kMinScale, kMaxScale] (finite, > 0, and
  // representable by the float32 fast path); anything else is an Error for the fast path and the
  // reference alike. Use 1 for "no scaling" and 1/T for a softmax temperature T.
  std::optional<double> scale;
  Causal causal = Causal::none;
  // Boolean (true = may attend) or f32 additive mask, rank 1..4, broadcastable to
  // [B, H, Lq, Lk]. The last dimension must be contiguous or broadcast (size 1).
  std::optional<TensorView> mask;
  // i32 or i64, shape [B], every value in [0, Lk].
  std::optional<TensorView> key_lengths;
  // Required when K (resp. V) has a scaled dtype (i8, fp8_e4m3), and only then: f32 [B, Hkv, Lk]
  // (one scale per token of each K/V head, as KvCache stores int8 by default), [Hkv] (per head)
  // or [1] (per tensor). The value computed with is float(k) * scale, rounded to f32.
  std::optional<TensorView> k_scales;
  std::optional<TensorView> v_scales;
  // The variants below act on each score in this order (docs/api.md, "Attention variants"), for
  // query i at position p(i) = i + Lk - Lq among the keys (bottom-right aligned, as
  // Causal::bottom_right) and key j:
  //   1. s = scale * q.k
  //   2. soft-capping: s <- softcap * tanh(s / softcap) (Gemma 2). 0 = off; else finite and > 0.
  //   3. ALiBi: s <- s - slope_h * |p(i) - j| for query head h. alibi_slopes: f32 [H], or [B, H]
  //      per sequence (FlashAttention's; B = the sequences of a packed or paged batch); or
  //      alibi = true for the standard geometric slopes of H heads (Press et al.: 2^(-8(h+1)/n)
  //      for the first n = 2^floor(log2 H) heads, 2^(-4(2k+1)/n) for the k-th head after them).
  //   4. masks: causal, mask, key_lengths, and the sliding window: key j is attended only if
  //      p(i) - window_left <= j <= p(i) + window_right; -1 leaves that side unbounded
  //      (FlashAttention's window_size).
  //   5. softmax over the attended keys with an optional sink logit per query head (gpt-oss) in
  //      the denominator only: out = sum_j e^(s_j - m) v_j / (e^(sink_h - m) + sum_j e^(s_j - m)),
  //      m the max over the s_j and sink_h; lse includes the sink; a row with every key masked
  //      gives 0. sinks: f32 [H], finite or -inf (no sink for that head).
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  double softcap = 0;
  bool alibi = false;
  std::optional<TensorView> alibi_slopes;
  std::optional<TensorView> sinks;
  // Optional outputs: f32 log-sum-exp of each row's (scaled, masked) scores [B, H, Lq], and the
  // attention weights [B, H, Lq, Lk] (what people plot as a heatmap).
  std::optional<OutputView> lse;
  std::optional<OutputView> weights;
};

// Instruction sets the fast path can be capped to, named by capability. `best` means no cap.
// x86-64, in order: scalar, sse4, avx2, avx512, avx512_vnni, avx512_bf16. avx512_vnni is AVX-512
// with the AVX512-VNNI integer dot products (Cascade Lake, Ice Lake and every later AVX-512 core):
// the P V of int8-cache decoding runs on vpdpwssd there, everything else on the avx512 kernels.
// avx512_bf16 adds the AVX512-BF16 dot product (vdpbf16ps): f32 calls run the avx512 kernels
// there, calls with bf16 Q and K/V run the native bf16 kernel. A cap of avx512 keeps AVX-512 but
// makes bf16 and int8 calls take the portable path (convert to f32), so that path is testable on
// any CPU.
// aarch64, in order: scalar, neon (Advanced SIMD, every ARMv8-A server core), sve (the Scalable
// Vector Extension at the CPU's vector length: units exist for 128, 256 and 512 bits; a CPU with
// another length runs neon). The names added after the first five come after `best` so that the
// values of the earlier names stay.
// A cap names a target of the architecture the library was built for (set_max_target throws
// otherwise).
enum class Target : std::uint8_t {
  scalar,
  sse4,
  avx2,
  avx512,
  avx512_bf16,
  best,
  neon,
  sve,
  avx512_vnni
};

CPUATTN_API const char* target_name(Target target);
// Parses "scalar", "sse4", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "neon", "sve" or
// "best";
// throws Error otherwise.
CPUATTN_API Target parse_target(const std::string& name);

// The portable SIMD library the kernels are compiled with. Both run the same kernels (same
// tiling, masking and softmax, written once against one vector contract) and give results within
// the same stated tolerances; they differ in the instructions each library emits.
//   highway  Google Highway (the default): every target, including the portable fallback.
//   xsimd    xsimd, for SSE4.2, AVX2+FMA and AVX-512; below SSE4 (a scalar cap or an old CPU) the
//            call runs Highway's portable target and active_simd() says so.
enum class Simd : std::uint8_t { highway, xsimd };

CPUATTN_API const char* simd_name(Simd simd);
// Parses "highway" or "xsimd"; throws Error otherwise.
CPUATTN_API Simd parse_simd(const std::string& name);

// Execution context: which threads run the fast path, a cap on the SIMD target, and the
// scratch memory kernels reuse between calls (so steady-state calls do not allocate).
// A Context may be used by several threads at once (every call, set_max_target and
// set_scratch_limit; not trim()). Without one, calls use a process-wide default context
// (default_context()) that runs on the caller's oneTBB arena and honours CPUATTN_TARGET.
//
// Memory: each thread that runs a call keeps its scratch buffers for the next call, sized by the
// largest call it has run. A service that once ran a huge request would keep that memory for
// good; set_scratch_limit() bounds what a thread keeps between uses, and trim() frees it all.
class CPUATTN_API Context {
 public:
  // num_threads == 0: run in the calling thread's task arena (whatever oneTBB arena the caller
  // is in, or the default one). num_threads > 0: run in an arena of that many threads, at most
  // as many as oneTBB may run (the machine's cores unless a tbb::global_control says otherwise):
  // more threads than cores would only time-slice, and results never depend on the count.
  explicit Context(int num_threads = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int num_threads() const;  // the configured value (0 = caller's arena)
  // Caps the SIMD target. A target the CPU lacks falls back to the best one below it.
  // The default context starts from the environment variable CPUATTN_TARGET, if set.
  void set_max_target(Target target);
  Target max_target() const;
  // Selects the SIMD provider (default highway). The default context starts from the
  // environment variable CPUATTN_SIMD, if set.
  void set_simd(Simd simd);
  Simd simd() const;

  // After each use, a thread frees any of its scratch buffers larger than `bytes` (the next call
  // that needs more allocates it again). Default: no limit. Safe to call at any time.
  void set_scratch_limit(std::size_t bytes);
  std::size_t scratch_limit() const;
  // Frees the scratch memory of every thread, including threads that have exited. Must not run
  // while another thread is calling into the library with this context.
  void trim();
  // Bytes of scratch kept by all threads now. Same restriction as trim().
  std::size_t retained_scratch_bytes() const;

  struct Impl;

 private:
  friend struct detail::ContextAccess;
  std::unique_ptr<Impl> impl_;
};

// The context calls use when they are given none: on the caller's oneTBB arena, capped by
// CPUATTN_TARGET. Lives until the process exits.
CPUATTN_API Context& default_context();

// The fused fast path. Deterministic: the result does not depend on the number of threads.
// Dtypes: Q f32, bf16 or f16; K and V the same dtype, any K/V dtype of the list (a scaled one,
// i8 or fp8_e4m3, with k_scales and v_scales); out f32, bf16 or f16 (rounded to nearest even);
// lse f32. Inputs are converted once,
// while a tile is packed; scores, softmax and accumulation are f32. With bf16 Q, K and V on a
// CPU with AVX512-BF16 (target avx512_bf16), Q K^T and P V run on vdpbf16ps, with P rounded to
// bf16; the error bounds of each path are in docs/precision.md. When opts.weights is
// requested, the call runs reference_attention() instead (the [B, H, Lq, Lk] weights defeat fusion
// anyway): out, lse and weights then come from double precision, at the reference's speed and with
// its O(Lq * Lk) work per head.
CPUATTN_API void attention(const TensorView& q, const TensorView& k, const TensorView& v,
                           const OutputView& out, const AttentionOptions& opts = {},
                           Context* context = nullptr);

// The oracle: same semantics, accumulates in double precision. Accepts f32 or f64 tensors and
// writes f32 or f64 outputs. Slow and plain by design; every fast path is tested against it.
CPUATTN_API void reference_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const OutputView& out, const AttentionOptions& opts = {});

// Packed variable-length batches (FlashAttention's varlen): B sequences stored back to back,
// q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out [total_q, H, Dv], with
// cumulative offsets cu_seqlens_q / cu_seqlens_k (int32 or int64, [B + 1], starting at 0,
// non-decreasing, ending at total_q / total_k): sequence b is rows [cu[b], cu[b + 1]) and attends
// only to its own keys. Every option applies per sequence (causal and the window are aligned to
// each sequence's own Lq and Lk) except mask, key_lengths and weights, which are errors here.
// lse, if given, is f32 [H, total_q] (FlashAttention's layout); scaled K/V take k_scales /
// v_scales f32 [Hkv, total_k], [Hkv] or [1].
// A sequence with no queries is skipped; one with queries but no keys gives out 0 (lse -inf, or
// its sink). The sequences run as one set of tasks on the context's threads.
CPUATTN_API void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const OutputView& out, const TensorView& cu_seqlens_q,
                                  const TensorView& cu_seqlens_k, const AttentionOptions& opts = {},
                                  Context* context = nullptr);
// The oracle of attention_varlen (f32 or f64, as reference_attention).
CPUATTN_API void reference_attention_varlen(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const OutputView& out,
                                            const TensorView& cu_seqlens_q,
                                            const TensorView& cu_seqlens_k,
                                            const AttentionOptions& opts = {});

// A paged KV cache as attention() reads it in place (vLLM's layout): the keys and values of B
// sequences stored in pages of P tokens (P a power of two) drawn from one pool,
//   k_pages [num_pages, Hkv, P, D], v_pages [num_pages, Hkv, P, Dv]: one K/V dtype
//   block_table int32 [B, max_pages]: token j of sequence b is row j % P of page
//     block_table[b, j / P]
//   seq_lens int32 or int64 [B]: sequence b holds tokens [0, seq_lens[b]), at most max_pages * P
//   k_scales, v_scales: f32 [num_pages, Hkv, P], [Hkv] or [1], required exactly when the pages
//     have a scaled dtype (i8, fp8_e4m3)
// Only the first ceil(seq_lens[b] / P) entries of a table row are read, and each must be in
// [0, num_pages); the rest may hold anything (-1, say). Sequences may share pages (a common
// prefix). PagedKvCache (layers.h) manages such a pool. A pool's pages may lie any whole number
// of elements apart (strides[0]); pages a multiple of 4 KiB apart all start at the same L1 set, so
// a decode step's rows of several pages compete for its ways: PagedKvCache puts them a 64-byte
// line further apart (docs/performance.md#dm-page-stride).
struct PagedKv {
  TensorView k_pages, v_pages, block_table, seq_lens;
  std::optional<TensorView> k_scales, v_scales;
};

// Attention of q [B, H, Lq, D] to the paged cache, out [B, H, Lq, Dv] (lse [B, H, Lq]), reading the
// pages in place: nothing is gathered into a contiguous buffer. Sequence b has Lk = seq_lens[b]
// keys, and every option is aligned to it (query i sits at position i + seq_lens[b] - Lq for
// causal bottom_right, the window and ALiBi): decoding (Lq = 1) and chunked prefill or speculative
// verification against the cache (Lq > 1, Causal::bottom_right). A sequence of length 0 gives
// out 0. mask, key_lengths, weights and opts.k_scales / v_scales (use PagedKv's) are errors here.
CPUATTN_API void attention(const TensorView& q, const PagedKv& kv, const OutputView& out,
                           const AttentionOptions& opts = {}, Context* context = nullptr);
// The oracle of paged attention (f32 or f64, as reference_attention).
CPUATTN_API void reference_attention(const TensorView& q, const PagedKv& kv, const OutputView& out,
                                     const AttentionOptions& opts = {});

// The SIMD target the fast path would run on with `context` (or the default context).
CPUATTN_API Target active_target(const Context* context = nullptr);
// How a prefill with bf16 Q, K and V would compute its products: "amx_bf16" (AMX tiles, head
// sizes a multiple of 32), "avx512_bf16" (vdpbf16ps) or "f32" (converted to f32 while packing,
// then the f32 kernels of active_target()).
CPUATTN_API const char* active_bf16_path(const Context* context = nullptr);
// The SIMD provider it would run with (see Simd: xsimd falls back to highway below SSE4).
CPUATTN_API Simd active_simd(const Context* context = nullptr);
// The targets this CPU and this build support, best first.
CPUATTN_API std::string supported_targets();

}  // namespace cpuattn
