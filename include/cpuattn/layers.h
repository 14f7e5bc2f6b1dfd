// cpuattn layers: what services build from the attention kernel.
//
//   Linear                   y = x W + b, with W packed once for the SIMD product
//   MultiHeadAttention       projections, heads, fused attention, output projection; self,
//                            causal, cross attention and incremental decoding with a KvCache
//   AdditiveAttention        Bahdanau: score(h_i, s_j) = v^T tanh(W1 h_i + W2 s_j)
//   MultiplicativeAttention  Luong: score(h_i, s_j) = h_i^T W s_j (optionally / sqrt(d_dec))
//
// Conventions are those of cpuattn.h: f32 strided views whose last dimension is contiguous,
// validation of every argument before anything is written (cpuattn::Error names the argument
// and the shapes), an optional Context for threads and the SIMD target cap, and results that
// do not depend on the number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "cpuattn/positional.h"

namespace cpuattn {

namespace detail {
struct PackedMatrix;
}

// A dense layer y = x W + b. The constructor copies W [K, N] (and b [N]) into the panel layout
// the SIMD product streams, so the caller's buffers may be freed afterwards; forward() reads x
// once per output panel block and never allocates in steady state.
class CPUATTN_API Linear {
 public:
  // weight: f32 or bf16 [K, N] (rows may be strided, the last dimension contiguous); bias: f32
  // [N]. bf16 weights are packed as bf16 (half the memory and half the bytes a decoding step
  // streams) and widened to f32 as they are loaded; products and sums are f32, so the result is
  // exactly that of f32 weights holding the same (bf16) values.
  explicit Linear(const TensorView& weight, const std::optional<TensorView>& bias = std::nullopt);
  // Several matrices with the same K side by side, y = x [W0 | W1 | ...] + [b0 | b1 | ...]: one
  // product computes, e.g., the Q, K and V projections and reads x once. `biases` is empty (no
  // bias) or has one entry per weight (std::nullopt for a part without bias).
  static Linear concat(const std::vector<TensorView>& weights,
                       const std::vector<std::optional<TensorView>>& biases = {});

  std::int64_t in_features() const;   // K
  std::int64_t out_features() const;  // N

  // x: f32 [..., K] of rank 1 to 4; y: f32 [..., N] with the same leading shape. Leading
  // dimensions may have any strides (e.g. a [B, L, K] slice of a wider buffer); y must not
  // overlap x.
  void forward(const TensorView& x, const OutputView& y, Context* context = nullptr) const;

 private:
  explicit Linear(std::shared_ptr<const detail::PackedMatrix> m);
  std::shared_ptr<const detail::PackedMatrix> m_;
};

// The scales of a cache of a scaled dtype (int8 and the like; cpuattn.h's list). Empty (the
// default): each token of each K/V head is stored with its own scale, max|x| / (the largest
// stored value: 127 for int8), kept beside it. Given: static scales (vLLM's k_scale / v_scale),
// one for every K/V head (size 1) or one per head (size kv_heads), each finite and > 0; a value
// x is stored as x / scale rounded to nearest even and saturated to the type's range. Static
// scales read 4 bytes less per token and head and match a cache written elsewhere with them;
// per-token ones follow each token's range.
struct KvScales {
  std::vector<float> k, v;
};

// The keys and values of past tokens for incremental decoding, owned:
// keys [batch, kv_heads, capacity, head_dim], values [batch, kv_heads, capacity, value_dim],
// stored as any K/V dtype of cpuattn.h's list: f32, bf16 or f16 (rounded to nearest even), or a
// scaled one (int8: symmetric) with the scales of KvScales. bf16/f16 halve the bytes a decode
// step reads, 1-byte types quarter them; attention() and MultiHeadAttention::decode read the
// stored dtype directly. One length for the whole batch (use one cache per sequence for ragged
// batches, or key_lengths).
class CPUATTN_API KvCache {
 public:
  // growable = false: appending beyond `capacity` throws Error and changes nothing.
  // growable = true: such an append first doubles the capacity (or more, to fit), copying the
  // cached tokens once; reserve() grows ahead of time.
  // dtype: a K/V dtype (is_kv_dtype); anything else is an Error, and so are scales for a dtype
  // that is not scaled.
  KvCache(std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
          std::int64_t capacity, bool growable = false, DType dtype = DType::f32,
          const KvScales& scales = {});
  ~KvCache();
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;

  std::int64_t batch() const;
  std::int64_t kv_heads() const;
  std::int64_t head_dim() const;
  std::int64_t value_dim() const;
  std::int64_t length() const;
  std::int64_t capacity() const;
  bool growable() const;
  DType dtype() const;

  // Grows to at least `capacity` tokens (keeps the contents). Throws Error on a fixed cache.
  void reserve(std::int64_t capacity);
  // Forgets every token; keeps the memory.
  void clear();
  // Keeps the first `length` tokens (<= length()): rolls back rejected speculative tokens.
  void truncate(std::int64_t length);
  // Appends n tokens: k [batch, kv_heads, n, head_dim], v [batch, kv_heads, n, value_dim], f32,
  // bf16 or f16, converted to the cache's dtype. A cache of a scaled dtype rejects non-finite
  // values (Error, nothing stored).
  void append(const TensorView& k, const TensorView& v);
  // The cached tokens in the stored dtype: [batch, kv_heads, length, head_dim] and
  // [.., value_dim]; for a scaled dtype also their scales, f32 [batch, kv_heads, length] per
  // token or [kv_heads] static (std::nullopt for other dtypes). Pass them as
  // AttentionOptions::k_scales / v_scales.
  TensorView keys() const;
  TensorView values() const;
  std::optional<TensorView> key_scales() const;
  std::optional<TensorView> value_scales() const;

  struct Storage;

 private:
  friend class MultiHeadAttention;
  std::unique_ptr<Storage> s_;
};

// A paged KV cache (vLLM's PagedAttention design): one pool of num_pages pages, each holding
// page_size tokens (a power of two) of every K/V head, shared by any number of sequences. A
// sequence is a list of pages, taken one at a time as it grows, so memory is not reserved per
// sequence up to a maximum length and does not fragment. fork() starts a sequence that shares a
// prefix of another's pages (a prefix cache: a system prompt stored once); a shared page is copied
// only when a sequence writes into it (copy-on-write), and a page returns to the pool when the last
// sequence holding it lets go. Storage: any K/V dtype, as KvCache's (a scaled one with per-token
// scales beside the pool, or static ones: KvScales), read in place by attention(q, batch(...)).
// Not thread-safe: one thread changes a cache at a time (attention calls may read a batch() view
// concurrently as long as nothing changes the cache meanwhile).
class CPUATTN_API PagedKvCache {
 public:
  PagedKvCache(std::int64_t num_pages, std::int64_t page_size, std::int64_t kv_heads,
               std::int64_t head_dim, std::int64_t value_dim, DType dtype = DType::f32,
               const KvScales& scales = {});
  ~PagedKvCache();
  PagedKvCache(PagedKvCache&&) noexcept;
  PagedKvCache& operator=(PagedKvCache&&) noexcept;

  std::int64_t num_pages() const;
  std::int64_t page_size() const;
  std::int64_t kv_heads() const;
  std::int64_t head_dim() const;
  std::int64_t value_dim() const;
  DType dtype() const;
  std::int64_t free_pages() const;  // pages no sequence holds

  // A new empty sequence; returns its id (ids of freed sequences are reused).
  std::int64_t add_sequence();
  // A new sequence holding the first `length` tokens of `seq` (all of them by default), sharing
  // its pages: no page is taken until one of the two writes into a shared, partly filled page.
  std::int64_t fork(std::int64_t seq, std::optional<std::int64_t> length = std::nullopt);
  // Appends n tokens to `seq`: k [kv_heads, n, head_dim], v [kv_heads, n, value_dim], f32, bf16
  // or f16 (strided; last dimension contiguous), converted to the cache's dtype. Takes the pages
  // it needs (plus one if the last page is shared: copy-on-write). Throws Error and changes
  // nothing if the pool has too few free pages, or a cache of a scaled dtype is given a
  // non-finite value.
  void append(std::int64_t seq, const TensorView& k, const TensorView& v);
  // Keeps the first `length` tokens of `seq` (<= its length); pages past them are released.
  void truncate(std::int64_t seq, std::int64_t length);
  // Releases every page of `seq` and the id.
  void free(std::int64_t seq);
  std::int64_t length(std::int64_t seq) const;
  // The pages of `seq`, in token order (two sequences sharing a prefix show the same ids).
  std::vector<std::int32_t> pages(std::int64_t seq) const;

  // The pool and the block table of sequences `seqs` (in that order), for attention(q, ...,
  // out) with q [seqs.size(), H, Lq, D]. The table and lengths live in the cache and stay valid
  // until the next call to batch() or anything that changes the cache.
  PagedKv batch(const std::vector<std::int64_t>& seqs);

  // The whole pools, as batch() gives them: k [num_pages, kv_heads, page_size, head_dim] and v
  // [.., value_dim] in the cache's dtype, a page every strides[0] elements (a page of an even
  // number of 64-byte lines, 1 KiB or more, is followed by one unused line), and the scales of a
  // scaled dtype, per token [num_pages, kv_heads, page_size] or static [kv_heads] (nullopt for
  // other dtypes). They stay where they are for the cache's life; their contents change with it.
  TensorView key_pages() const;
  TensorView value_pages() const;
  std::optional<TensorView> key_page_scales() const;
  std::optional<TensorView> value_page_scales() const;

  struct Storage;

 private:
  friend class MultiHeadAttention;
  std::unique_ptr<Storage> s_;
};

// QK-norm: RMSNorm of the projected queries and keys, y = x / sqrt(mean(x^2) + eps) * w, before
// the rotary embedding.
//   head:       over each head's head_dim values, w [head_dim] shared by the heads (Qwen3;
//               Gemma 3 with w = 1 + its stored weight)
//   projection: over all heads of a token at once, w [heads * head_dim] for Q and
//               [kv_heads * head_dim] for K (OLMo 2)
enum class QkNorm : std::uint8_t { none, head, projection };

struct MhaConfig {
  std::int64_t d_model = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;   // 0: same as heads. heads % kv_heads == 0 (GQA; 1 = MQA)
  std::int64_t head_dim = 0;   // 0: d_model / heads
  std::int64_t value_dim = 0;  // 0: head_dim
  // Rotary position embedding of Q and K inside the layer (cpuattn/positional.h; rotary_dim and
  // scaling included), applied after the projections and QK-norm while the rows are in cache.
  // Keys are cached rotated. Positions: 0 .. L-1 in forward() (each sequence's own in
  // forward_varlen()) unless given explicitly; in decode(), the cache's length (each sequence's
  // own in a paged cache) plus the token's index in the step. Self-attention only:
  // forward_cross() of a layer with rope is an Error.
  std::optional<RopeOptions> rope = std::nullopt;
  QkNorm qk_norm = QkNorm::none;  // weights: MhaWeights::q_norm, k_norm
  double qk_norm_eps = 1e-6;      // finite, > 0
};

// Weights in the x W convention (W [in, out]), f32 or bf16 (see Linear); biases optional, f32.
struct MhaWeights {
  TensorView wq;  // [d_model, heads * head_dim]
  TensorView wk;  // [d_model, kv_heads * head_dim]
  TensorView wv;  // [d_model, kv_heads * value_dim]
  TensorView wo;  // [heads * value_dim, d_model]
  std::optional<TensorView> bq = std::nullopt, bk = std::nullopt, bv = std::nullopt,
                            bo = std::nullopt;
  // QK-norm weights, f32 (MhaConfig::qk_norm): given exactly when qk_norm is not none.
  std::optional<TensorView> q_norm = std::nullopt, k_norm = std::nullopt;
};

// Multi-head attention: out = concat_h(attention(x Wq_h, x' Wk_h, x' Wv_h)) Wo + bo.
// Heads are split by strides over the projections' [B, L, heads, head_dim] output: nothing is
// transposed or copied between the projections and the fused kernel.
// `opts` are those of cpuattn::attention (scale, causal, mask, key_lengths, lse, weights), with
// H = heads, Lq = query tokens and Lk = key tokens.
class CPUATTN_API MultiHeadAttention {
 public:
  MultiHeadAttention(const MhaConfig& config, const MhaWeights& weights);
  ~MultiHeadAttention();
  MultiHeadAttention(MultiHeadAttention&&) noexcept;
  MultiHeadAttention& operator=(MultiHeadAttention&&) noexcept;

  const MhaConfig& config() const;  // with the defaults filled in

  // Self-attention (bidirectional, or causal via opts.causal): x, out [B, L, d_model]. x and out
  // of every entry are f32, bf16 or f16 (each its own): the layer computes in f32, widening a
  // 16-bit x exactly and rounding a 16-bit out to nearest even, so a bf16 out is the f32 out of
  // the same (bf16-valued) x, rounded.
  void forward(const TensorView& x, const OutputView& out, const AttentionOptions& opts = {},
               Context* context = nullptr) const;
  // The same with explicit positions for the rotary embedding (Hugging Face's position_ids: a
  // left-padded batch, a chunk that continues a sequence): int32 or int64 [B, L], or [L] for
  // every sequence, each in [0, 2^53). An Error for a layer without MhaConfig::rope.
  void forward(const TensorView& x, const TensorView& positions, const OutputView& out,
               const AttentionOptions& opts = {}, Context* context = nullptr) const;
  // Packed variable-length self-attention (as attention_varlen): x [T, d_model] holds sequences
  // back to back, sequence b its rows [cu_seqlens[b], cu_seqlens[b + 1]) (int32 or int64
  // [B + 1], from 0 to T), each attending only to its own tokens; out [T, d_model]. RoPE
  // positions: each sequence's own 0 .. length - 1, or `positions` [T] (int32 or int64). The
  // options apply per sequence as in attention_varlen (mask, key_lengths and weights are
  // errors; lse is [heads, T]).
  void forward_varlen(const TensorView& x, const TensorView& cu_seqlens, const OutputView& out,
                      const AttentionOptions& opts = {}, Context* context = nullptr) const;
  void forward_varlen(const TensorView& x, const TensorView& cu_seqlens,
                      const TensorView& positions, const OutputView& out,
                      const AttentionOptions& opts = {}, Context* context = nullptr) const;
  // Encoder-decoder attention: queries from xq [B, Lq, d_model], keys and values from the
  // encoder output xkv [B, Lk, d_model]; out [B, Lq, d_model].
  void forward_cross(const TensorView& xq, const TensorView& xkv, const OutputView& out,
                     const AttentionOptions& opts = {}, Context* context = nullptr) const;
  // One decoding step for n new tokens per sequence, x [B, n, d_model]: appends their K and V to
  // `cache`, then attends the n queries to every cached token with bottom-right causal alignment
  // (new token i sees cache positions <= old length + i). opts.causal must be none or
  // bottom_right; masks are [.., n, new length]. On error neither out nor the cache's tokens
  // change.
  void decode(const TensorView& x, KvCache& cache, const OutputView& out,
              const AttentionOptions& opts = {}, Context* context = nullptr) const;
  // The same step for sequences `seqs` of a paged cache, x [seqs.size(), n, d_model]: appends
  // each sequence's n new tokens (taking pages as needed), then attends to its pages in place.
  // Each sequence keeps its own length. `seqs` must be distinct. On error (among them a pool
  // without the free pages the step needs) neither out nor the cache changes.
  void decode(const TensorView& x, PagedKvCache& cache, const std::vector<std::int64_t>& seqs,
              const OutputView& out, const AttentionOptions& opts = {},
              Context* context = nullptr) const;
  // A cache shaped for this layer.
  KvCache make_cache(std::int64_t batch, std::int64_t capacity, bool growable = false,
                     DType dtype = DType::f32, const KvScales& scales = {}) const;

  // A paged cache shaped for this layer.
  PagedKvCache make_paged_cache(std::int64_t num_pages, std::int64_t page_size,
                                DType dtype = DType::f32, const KvScales& scales = {}) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Options shared by additive and multiplicative attention. Shapes use B (batch), Lq (decoder
// steps), Lk (encoder positions).
struct AlignOptions {
  std::optional<TensorView> values;       // f32 [B, Lk, dv]; default: the encoder states s
  std::optional<TensorView> mask;         // bool or additive f32, broadcastable to [B, Lq, Lk]
  std::optional<TensorView> key_lengths;  // i32 or i64 [B]
  std::optional<OutputView> weights;      // f32 [B, Lq, Lk]: the attention weights a_ij
};

struct AdditiveWeights {
  TensorView w1;                     // [d_dec, A], applied to the decoder states h
  TensorView w2;                     // [d_enc, A], applied to the encoder states s
  TensorView v;                      // [A]
  std::optional<TensorView> b1, b2;  // [A]
};

// Bahdanau attention: a_ij = softmax_j(v^T tanh(W1 h_i + b1 + W2 s_j + b2)), c_i = sum_j a_ij s_j.
// W1 h and W2 s are computed once per call (Lq + Lk products, not Lq x Lk); the Lq x Lk x A
// tanh-and-dot runs in SIMD (tanh: max relative error stated in lib/simd/math-inl.h and tested).
class CPUATTN_API AdditiveAttention {
 public:
  explicit AdditiveAttention(const AdditiveWeights& weights);
  std::int64_t decoder_dim() const;
  std::int64_t encoder_dim() const;
  std::int64_t attention_dim() const;
  // h f32 [B, Lq, d_dec] (Lq = 1 for one decoding step), s f32 [B, Lk, d_enc];
  // context f32 [B, Lq, dv] with dv = d_enc, or the width of opts.values.
  void forward(const TensorView& h, const TensorView& s, const OutputView& context,
               const AlignOptions& opts = {}, Context* context_threads = nullptr) const;

 private:
  Linear l1_, l2_;
  std::vector<float> v_;  // padded to whole vectors
  std::int64_t d_dec_, d_enc_, a_;
};

// Luong (general) attention: score = h_i^T W s_j, divided by sqrt(d_dec) when `scaled` (as
// Vaswani et al. advise). Runs as h W once, then the fused attention kernel.
class CPUATTN_API MultiplicativeAttention {
 public:
  // w: f32 [d_dec, d_enc].
  explicit MultiplicativeAttention(const TensorView& w, bool scaled = true);
  std::int64_t decoder_dim() const;
  std::int64_t encoder_dim() const;
  void forward(const TensorView& h, const TensorView& s, const OutputView& context,
               const AlignOptions& opts = {}, Context* context_threads = nullptr) const;

 private:
  Linear w_;
  bool scaled_;
};

}  // namespace cpuattn
