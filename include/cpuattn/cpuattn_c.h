/* cpuattn C API: a stable, plain C99 interface over the C++ API of cpuattn.h and layers.h.
 *
 * Conventions
 * -----------
 * - Every function that can fail returns a cpuattn_status. CPUATTN_OK is 0; anything else is an
 *   error, and cpuattn_last_error() then gives its message.
 * - No C++ exception ever leaves a function of this header: each entry point catches everything
 *   and maps it to a status (see cpuattn_status).
 * - Arguments are validated before anything is written: on failure, outputs (tensors and the
 *   `**out` / `*out` result pointers) are left untouched, exactly as the C++ API leaves its
 *   outputs untouched when it throws.
 * - A NULL `cpuattn_context*` means the process-wide default context (cpuattn::default_context():
 *   the caller's thread, capped by the environment variable CPUATTN_TARGET).
 * - Last error: every status-returning function sets the calling thread's last-error message when
 *   it fails and CLEARS it (to "") when it succeeds, so cpuattn_last_error() always describes the
 *   most recent status-returning call of this thread. Functions that return no status
 *   (cpuattn_status_name, cpuattn_last_error, cpuattn_version*, the *_name functions, the
 *   *_init and *_destroy functions) leave it alone.
 * - Versioned structs (cpuattn_attention_options, cpuattn_mha_config, cpuattn_mha_weights) start
 *   (and, since version 3, cpuattn_paged_kv) with `size_t struct_size`, which the caller sets to
 * sizeof(the struct) (the *_init functions do). The library reads a struct as follows:
 *   - struct_size < the struct's *_MIN_SIZE (0 included): CPUATTN_ERROR_INVALID_ARGUMENT, whose
 *     message names struct_size;
 *   - *_MIN_SIZE <= struct_size <= sizeof(struct): only the fields that lie entirely within
 *     struct_size bytes are read, the others take their defaults (an older caller, compiled
 *     against a header with fewer fields);
 *   - sizeof(struct) < struct_size <= 4096: accepted only if every byte past the fields this
 *     library knows is zero (a newer caller leaving its new fields at their zero defaults); a
 *     nonzero byte is CPUATTN_ERROR_INVALID_ARGUMENT naming struct_size (a feature this library
 *     lacks);
 *   - struct_size > 4096: CPUATTN_ERROR_INVALID_ARGUMENT (most likely an uninitialized field).
 *
 * Tensors
 * -------
 * cpuattn_tensor describes a strided view that the caller owns: data pointer, dtype, rank
 * (0..4), shape and strides. Strides count ELEMENTS (not bytes) and must always be given:
 * cpuattn_tensor_contiguous() fills row-major strides, cpuattn_tensor_blhd() the logical
 * [B, H, L, D] view of [B, L, H, D] memory. The last dimension must be contiguous (stride 1);
 * other strides may be any non-negative value (0 broadcasts an input). Inputs are never written
 * (a const buffer may be passed with a cast to void*); outputs (out, lse, weights) are written
 * through `data`. Shapes, dtypes and semantics are those of cpuattn.h:
 *   q [B, H, Lq, D]   k [B, Hkv, Lk, D]   v [B, Hkv, Lk, Dv]   out [B, H, Lq, Dv]
 *
 * Thread safety: as the C++ API (a context may be shared by threads; a KV cache or an MHA layer
 * must not be modified by one thread while another uses it).
 */
#ifndef CPUATTN_CPUATTN_C_H_
#define CPUATTN_CPUATTN_C_H_

#include <stddef.h>
#include <stdint.h>

#include "cpuattn/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this C interface; incremented when it changes (fields are only ever appended to the
 * versioned structs, and functions only added). cpuattn_c_api_version() gives the library's. */
#define CPUATTN_C_API_VERSION 6

/* ----------------------------------------------------------------------------- status, errors */

typedef enum cpuattn_status {
  CPUATTN_OK = 0,
  /* A cpuattn::Error: bad shapes, dtypes, strides, sizes, options or struct_size. The message is
   * exactly the C++ what() text, "cpuattn: ...", naming the argument and the shapes. */
  CPUATTN_ERROR_INVALID_ARGUMENT = 1,
  /* std::bad_alloc: memory could not be allocated (nothing changed). */
  CPUATTN_ERROR_OUT_OF_MEMORY = 2,
  /* A required pointer argument is NULL (a tensor descriptor, a handle, an out-pointer). A
   * descriptor whose `data` is NULL is CPUATTN_ERROR_INVALID_ARGUMENT, as in C++. */
  CPUATTN_ERROR_NULL_POINTER = 3,
  /* Any other exception (a bug: the C++ API throws only cpuattn::Error and std::bad_alloc). */
  CPUATTN_ERROR_INTERNAL = 4
} cpuattn_status;

/* "ok", "invalid_argument", "out_of_memory", "null_pointer", "internal"; "unknown" otherwise. */
CPUATTN_API const char* cpuattn_status_name(cpuattn_status status);

/* The message of the calling thread's most recent failed status-returning call, "" after a
 * successful one (never NULL). Valid until the next status-returning call of this thread.
 * Messages start with "cpuattn: ". */
CPUATTN_API const char* cpuattn_last_error(void);

/* ------------------------------------------------------------------------------------ version */

/* The library version (the CMake project version, e.g. 0.1.0). NULL pointers are skipped. */
CPUATTN_API void cpuattn_version(int* major, int* minor, int* patch);
/* "0.1.0" */
CPUATTN_API const char* cpuattn_version_string(void);
/* The CPUATTN_C_API_VERSION the library was built with. */
CPUATTN_API int cpuattn_c_api_version(void);

/* ---------------------------------------------------------------------------------- enums */

/* Same values as cpuattn::DType. */
typedef enum cpuattn_dtype {
  CPUATTN_DTYPE_F32 = 0,
  CPUATTN_DTYPE_F64 = 1,
  CPUATTN_DTYPE_BF16 = 2, /* stored as the 16-bit pattern */
  CPUATTN_DTYPE_F16 = 3,  /* stored as the 16-bit pattern */
  CPUATTN_DTYPE_BOOL = 4, /* one byte, 0 = false */
  CPUATTN_DTYPE_I32 = 5,
  CPUATTN_DTYPE_I64 = 6,
  CPUATTN_DTYPE_I8 = 7,
  CPUATTN_DTYPE_FP8_E4M3 = 8 /* OCP FP8 E4M3 (float8_e4m3fn), one byte; since C API version 4 */
} cpuattn_dtype;

/* "float32", "float64", "bfloat16", "float16", "bool", "int32", "int64", "int8"; "unknown". */
CPUATTN_API const char* cpuattn_dtype_name(cpuattn_dtype dtype);

/* Same values as cpuattn::Target. BEST means no cap. */
typedef enum cpuattn_target {
  CPUATTN_TARGET_SCALAR = 0,
  CPUATTN_TARGET_SSE4 = 1,
  CPUATTN_TARGET_AVX2 = 2,
  CPUATTN_TARGET_AVX512 = 3,
  CPUATTN_TARGET_AVX512_BF16 = 4,
  CPUATTN_TARGET_BEST = 5,
  CPUATTN_TARGET_NEON = 6,
  CPUATTN_TARGET_SVE = 7,
  CPUATTN_TARGET_AVX512_VNNI = 8
} cpuattn_target;

/* "scalar", "sse4", "avx2", "avx512", "avx512_bf16", "best", "neon", "sve", "avx512_vnni";
 * "unknown". */
CPUATTN_API const char* cpuattn_target_name(cpuattn_target target);

/* Same values as cpuattn::Causal. */
typedef enum cpuattn_causal {
  CPUATTN_CAUSAL_NONE = 0,
  CPUATTN_CAUSAL_TOP_LEFT = 1,    /* query i sees keys j <= i */
  CPUATTN_CAUSAL_BOTTOM_RIGHT = 2 /* query i sees keys j <= i + Lk - Lq */
} cpuattn_causal;

/* ------------------------------------------------------------------------------------ tensors */

#define CPUATTN_MAX_RANK 4

typedef struct cpuattn_tensor {
  void* data;
  cpuattn_dtype dtype;
  int rank;                          /* 0..4 */
  int64_t shape[CPUATTN_MAX_RANK];   /* entries past rank are ignored */
  int64_t strides[CPUATTN_MAX_RANK]; /* in elements; required */
} cpuattn_tensor;

/* Fills *tensor with a row-major (C order) view of `shape` (rank entries; may be NULL when rank
 * is 0). Fails on a NULL tensor, rank outside 0..4, an unknown dtype or strides that overflow 64
 * bits; sizes are validated by the call the tensor is passed to. */
CPUATTN_API cpuattn_status cpuattn_tensor_contiguous(cpuattn_tensor* tensor, void* data,
                                                     cpuattn_dtype dtype, int rank,
                                                     const int64_t* shape);
/* Fills *tensor with the logical [B, H, L, D] view of memory laid out as [B, L, H, D] (a
 * projection's output before heads are split). */
CPUATTN_API cpuattn_status cpuattn_tensor_blhd(cpuattn_tensor* tensor, void* data,
                                               cpuattn_dtype dtype, int64_t B, int64_t L, int64_t H,
                                               int64_t D);

/* ---------------------------------------------------------------------------------- contexts */

/* Threads, a SIMD target cap and reusable scratch memory (cpuattn::Context). */
typedef struct cpuattn_context cpuattn_context;

/* num_threads 0: run on the caller's oneTBB arena; N > 0: an arena of N threads (capped at the
 * machine's cores; results never depend on N). Negative: CPUATTN_ERROR_INVALID_ARGUMENT. */
CPUATTN_API cpuattn_status cpuattn_context_create(int num_threads, cpuattn_context** out);
/* NULL is a no-op. */
CPUATTN_API void cpuattn_context_destroy(cpuattn_context* context);
/* Caps the SIMD target (NULL: the default context's cap). A target the CPU lacks falls back to
 * the best one below it. */
CPUATTN_API cpuattn_status cpuattn_context_set_max_target(cpuattn_context* context,
                                                          cpuattn_target target);
CPUATTN_API cpuattn_status cpuattn_context_max_target(const cpuattn_context* context,
                                                      cpuattn_target* out);
CPUATTN_API cpuattn_status cpuattn_context_num_threads(const cpuattn_context* context, int* out);

/* The target the fast path would run on with `context`. */
CPUATTN_API cpuattn_status cpuattn_active_target(const cpuattn_context* context,
                                                 cpuattn_target* out);
/* The targets this CPU and build support, best first, comma-separated (e.g. "avx2,sse4,scalar").
 * *out points to a string that lives until the process exits. */
CPUATTN_API cpuattn_status cpuattn_supported_targets(const char** out);

/* ---------------------------------------------------------------------------------- attention */

typedef struct cpuattn_attention_options {
  size_t struct_size; /* sizeof(cpuattn_attention_options) */
  int has_scale;      /* 0: scale = 1/sqrt(D) */
  double scale;       /* used when has_scale != 0; in [1.18e-38, 2.36e38] */
  cpuattn_causal causal;
  /* Optional tensors, NULL = absent (see cpuattn::AttentionOptions): */
  const cpuattn_tensor* mask;        /* bool or additive f32, broadcastable to [B, H, Lq, Lk] */
  const cpuattn_tensor* key_lengths; /* i32 or i64 [B], values in [0, Lk] */
  const cpuattn_tensor* k_scales;    /* f32 [B, Hkv, Lk], required exactly when k is i8 */
  const cpuattn_tensor* v_scales;    /* f32 [B, Hkv, Lk], required exactly when v is i8 */
  /* Optional outputs, NULL = not wanted: */
  const cpuattn_tensor* lse;     /* f32 [B, H, Lq], natural-log logsumexp of each row */
  const cpuattn_tensor* weights; /* f32 [B, H, Lq, Lk]; the call then runs the reference */
  /* Since C API version 2: the variants (see cpuattn::AttentionOptions; all zero = none). A struct
   * of version 1's size ends before them and gets these defaults. */
  int has_window;                     /* 0: no sliding window */
  int64_t window_left, window_right;  /* used when has_window != 0; -1 = unbounded side */
  double softcap;                     /* 0 = off; else finite > 0: s <- C tanh(s / C) */
  int alibi;                          /* nonzero: ALiBi with the standard slopes of H heads */
  const cpuattn_tensor* alibi_slopes; /* f32 [H] or [B, H] (per sequence), or NULL */
  const cpuattn_tensor* sinks;        /* f32 [H] sink logits (finite or -inf), or NULL */
} cpuattn_attention_options;

/* The smallest struct_size accepted: struct_size, has_scale, scale and causal. */
#define CPUATTN_ATTENTION_OPTIONS_MIN_SIZE offsetof(cpuattn_attention_options, mask)

/* Sets struct_size = sizeof(cpuattn_attention_options) and every field to its default (no
 * scale, no causal mask, no optional tensor). A NULL argument is a no-op. */
CPUATTN_API void cpuattn_attention_options_init(cpuattn_attention_options* options);

/* The fused fast path (cpuattn::attention). options may be NULL (all defaults). */
CPUATTN_API cpuattn_status cpuattn_attention(const cpuattn_tensor* q, const cpuattn_tensor* k,
                                             const cpuattn_tensor* v, const cpuattn_tensor* out,
                                             const cpuattn_attention_options* options,
                                             cpuattn_context* context);
/* The double-precision oracle (cpuattn::reference_attention; f32 or f64 tensors). Same
 * arguments without the context. */
CPUATTN_API cpuattn_status cpuattn_reference_attention(const cpuattn_tensor* q,
                                                       const cpuattn_tensor* k,
                                                       const cpuattn_tensor* v,
                                                       const cpuattn_tensor* out,
                                                       const cpuattn_attention_options* options);

/* Packed variable-length batches (cpuattn::attention_varlen; since C API version 2): q
 * [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out [total_q, H, Dv], cu_seqlens_q /
 * cu_seqlens_k i32 or i64 [B + 1]; options->lse is f32 [H, total_q]; mask, key_lengths and
 * weights are errors. */
CPUATTN_API cpuattn_status
cpuattn_attention_varlen(const cpuattn_tensor* q, const cpuattn_tensor* k, const cpuattn_tensor* v,
                         const cpuattn_tensor* out, const cpuattn_tensor* cu_seqlens_q,
                         const cpuattn_tensor* cu_seqlens_k,
                         const cpuattn_attention_options* options, cpuattn_context* context);
CPUATTN_API cpuattn_status cpuattn_reference_attention_varlen(
    const cpuattn_tensor* q, const cpuattn_tensor* k, const cpuattn_tensor* v,
    const cpuattn_tensor* out, const cpuattn_tensor* cu_seqlens_q,
    const cpuattn_tensor* cu_seqlens_k, const cpuattn_attention_options* options);

/* ----------------------------------------------------------------------------- paged KV caches */

/* A paged KV cache as attention reads it in place (cpuattn::PagedKv; since C API version 3):
 *   k_pages [num_pages, Hkv, P, D], v_pages [num_pages, Hkv, P, Dv]: f32, bf16, f16 or i8 (one
 *     dtype); token j of sequence b is row j % P of page block_table[b, j / P]; P a power of 2
 *   block_table i32 [B, max_pages]: only each sequence's first ceil(seq_lens[b] / P) entries are
 *     read, and each must be in [0, num_pages)
 *   seq_lens i32 or i64 [B]
 *   k_scales, v_scales f32 [num_pages, Hkv, P]: required exactly when the pools are i8; a tensor
 *     whose data is NULL is absent.
 * cpuattn_paged_kv_cache_batch() fills one from a cache. */
typedef struct cpuattn_paged_kv {
  size_t struct_size; /* sizeof(cpuattn_paged_kv) */
  cpuattn_tensor k_pages;
  cpuattn_tensor v_pages;
  cpuattn_tensor block_table;
  cpuattn_tensor seq_lens;
  cpuattn_tensor k_scales;
  cpuattn_tensor v_scales;
} cpuattn_paged_kv;

/* The smallest struct_size accepted: struct_size and the pools, table and lengths. */
#define CPUATTN_PAGED_KV_MIN_SIZE offsetof(cpuattn_paged_kv, k_scales)

/* struct_size = sizeof, every tensor zero (absent). A NULL argument is a no-op. */
CPUATTN_API void cpuattn_paged_kv_init(cpuattn_paged_kv* kv);

/* Attention of q [B, H, Lq, D] to the paged cache, out [B, H, Lq, Dv] (options->lse f32
 * [B, H, Lq]), reading the pages in place (cpuattn::attention(q, PagedKv, out)). Every option is
 * aligned to each sequence's own length (causal bottom-right for decoding and chunked prefill);
 * options->mask, key_lengths, weights, k_scales and v_scales are errors (the scales go in kv). */
CPUATTN_API cpuattn_status cpuattn_attention_paged(const cpuattn_tensor* q,
                                                   const cpuattn_paged_kv* kv,
                                                   const cpuattn_tensor* out,
                                                   const cpuattn_attention_options* options,
                                                   cpuattn_context* context);
/* The double-precision oracle of cpuattn_attention_paged (f32 or f64 q and out). */
CPUATTN_API cpuattn_status cpuattn_reference_attention_paged(
    const cpuattn_tensor* q, const cpuattn_paged_kv* kv, const cpuattn_tensor* out,
    const cpuattn_attention_options* options);

/* cpuattn::PagedKvCache: a pool of num_pages pages of page_size tokens (a power of two) of every
 * K/V head, shared by sequences; f32, bf16, f16 or i8 (one f32 scale per token and K/V head).
 * A sequence takes pages one at a time as it grows; a fork shares its parent's pages until one
 * of them writes into a shared page (copy-on-write). Every function that fails changes nothing. */
typedef struct cpuattn_paged_kv_cache cpuattn_paged_kv_cache;

CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_create(int64_t num_pages, int64_t page_size,
                                                         int64_t kv_heads, int64_t head_dim,
                                                         int64_t value_dim, cpuattn_dtype dtype,
                                                         cpuattn_paged_kv_cache** out);
/* The same with static scales for a scaled dtype (cpuattn::KvScales; since C API version 4):
 * k_scales and v_scales hold n_scales floats each, 1 (per tensor) or kv_heads (per head), each
 * finite and > 0; n_scales 0 (the pointers may be NULL) gives per-token scales. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_create_scaled(
    int64_t num_pages, int64_t page_size, int64_t kv_heads, int64_t head_dim, int64_t value_dim,
    cpuattn_dtype dtype, const float* k_scales, const float* v_scales, int64_t n_scales,
    cpuattn_paged_kv_cache** out);
/* NULL is a no-op. */
CPUATTN_API void cpuattn_paged_kv_cache_destroy(cpuattn_paged_kv_cache* cache);
/* A new empty sequence; *out is its id (ids of freed sequences are reused). */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_add_sequence(cpuattn_paged_kv_cache* cache,
                                                               int64_t* out);
/* A new sequence holding the first `length` tokens of seq (length < 0: all of them), sharing
 * its pages; *out is its id. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_fork(cpuattn_paged_kv_cache* cache, int64_t seq,
                                                       int64_t length, int64_t* out);
/* Appends n tokens to seq: k [kv_heads, n, head_dim], v [kv_heads, n, value_dim]; f32, bf16 or
 * f16. Too few free pages, or a non-finite value for an i8 cache: invalid argument. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_append(cpuattn_paged_kv_cache* cache, int64_t seq,
                                                         const cpuattn_tensor* k,
                                                         const cpuattn_tensor* v);
/* Keeps the first `length` tokens of seq; pages past them return to the pool. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_truncate(cpuattn_paged_kv_cache* cache,
                                                           int64_t seq, int64_t length);
/* Releases every page of seq and its id. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_free_sequence(cpuattn_paged_kv_cache* cache,
                                                                int64_t seq);
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_length(const cpuattn_paged_kv_cache* cache,
                                                         int64_t seq, int64_t* out);
/* Pages no sequence holds. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_free_pages(const cpuattn_paged_kv_cache* cache,
                                                             int64_t* out);
/* seq's page ids in token order: *count is their number; the first min(*count, capacity) are
 * written to ids (which may be NULL when capacity is 0). */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_pages(const cpuattn_paged_kv_cache* cache,
                                                        int64_t seq, int32_t* ids, int64_t capacity,
                                                        int64_t* count);
/* Fills *out (out->struct_size set, as cpuattn_paged_kv_init does) with the pools and the block
 * table and lengths of sequences seqs[0..n) in that order, for cpuattn_attention_paged. The
 * table and lengths live in the cache until its next batch call or change; the pools for the
 * cache's life. Read-only. */
CPUATTN_API cpuattn_status cpuattn_paged_kv_cache_batch(cpuattn_paged_kv_cache* cache,
                                                        const int64_t* seqs, int64_t n,
                                                        cpuattn_paged_kv* out);

/* ---------------------------------------------------------------------------------- KV caches */

/* cpuattn::KvCache: keys [batch, kv_heads, capacity, head_dim] and values [.., value_dim] of past
 * tokens, stored as f32, bf16, f16 or i8 (one f32 scale per token and K/V head). */
typedef struct cpuattn_kv_cache cpuattn_kv_cache;

/* growable 0: appending beyond capacity fails and changes nothing; nonzero: the cache doubles.
 * Sizes beyond 2^40 elements of K or of V are CPUATTN_ERROR_INVALID_ARGUMENT; an allocation that
 * fails is CPUATTN_ERROR_OUT_OF_MEMORY. */
CPUATTN_API cpuattn_status cpuattn_kv_cache_create(int64_t batch, int64_t kv_heads,
                                                   int64_t head_dim, int64_t value_dim,
                                                   int64_t capacity, int growable,
                                                   cpuattn_dtype dtype, cpuattn_kv_cache** out);
/* The same with static scales (as cpuattn_paged_kv_cache_create_scaled; since C API version 4). */
CPUATTN_API cpuattn_status cpuattn_kv_cache_create_scaled(
    int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t value_dim, int64_t capacity,
    int growable, cpuattn_dtype dtype, const float* k_scales, const float* v_scales,
    int64_t n_scales, cpuattn_kv_cache** out);
/* NULL is a no-op. */
CPUATTN_API void cpuattn_kv_cache_destroy(cpuattn_kv_cache* cache);
CPUATTN_API cpuattn_status cpuattn_kv_cache_length(const cpuattn_kv_cache* cache, int64_t* out);
CPUATTN_API cpuattn_status cpuattn_kv_cache_capacity(const cpuattn_kv_cache* cache, int64_t* out);
/* Appends n tokens: k [batch, kv_heads, n, head_dim], v [batch, kv_heads, n, value_dim]; f32,
 * bf16 or f16. */
CPUATTN_API cpuattn_status cpuattn_kv_cache_append(cpuattn_kv_cache* cache, const cpuattn_tensor* k,
                                                   const cpuattn_tensor* v);
/* Forgets every token, keeps the memory. */
CPUATTN_API cpuattn_status cpuattn_kv_cache_clear(cpuattn_kv_cache* cache);
/* Keeps the first `length` tokens (length <= the current length). */
CPUATTN_API cpuattn_status cpuattn_kv_cache_truncate(cpuattn_kv_cache* cache, int64_t length);
/* Grows to at least `capacity` tokens (a fixed cache: invalid argument). */
CPUATTN_API cpuattn_status cpuattn_kv_cache_reserve(cpuattn_kv_cache* cache, int64_t capacity);
/* Views of the cached tokens in the stored dtype, [batch, kv_heads, length, head_dim] and
 * [.., value_dim]; the scales of a scaled dtype (i8): f32 [batch, kv_heads, length] per token, or
 * [kv_heads] static. For other dtypes
 * the scales view has data = NULL and rank 0 (pass `data ? &view : NULL` as k_scales/v_scales).
 * The views are read-only and valid until the cache next changes (append, reserve, destroy). */
CPUATTN_API cpuattn_status cpuattn_kv_cache_keys(const cpuattn_kv_cache* cache,
                                                 cpuattn_tensor* out);
CPUATTN_API cpuattn_status cpuattn_kv_cache_values(const cpuattn_kv_cache* cache,
                                                   cpuattn_tensor* out);
CPUATTN_API cpuattn_status cpuattn_kv_cache_key_scales(const cpuattn_kv_cache* cache,
                                                       cpuattn_tensor* out);
CPUATTN_API cpuattn_status cpuattn_kv_cache_value_scales(const cpuattn_kv_cache* cache,
                                                         cpuattn_tensor* out);

/* ---------------------------------------------------------------------- multi-head attention */

/* Rotary embedding and QK-norm of a decoder layer (cpuattn::RopeOptions, cpuattn::QkNorm; since
 * C API version 5). */
typedef enum cpuattn_rope_style {
  CPUATTN_ROPE_HALF = 0,       /* pairs (j, j + R/2): GPT-NeoX, Llama */
  CPUATTN_ROPE_INTERLEAVED = 1 /* pairs (2j, 2j + 1): GPT-J */
} cpuattn_rope_style;

typedef enum cpuattn_rope_scaling {
  CPUATTN_ROPE_SCALING_NONE = 0,
  CPUATTN_ROPE_SCALING_LINEAR = 1,
  CPUATTN_ROPE_SCALING_NTK = 2,
  CPUATTN_ROPE_SCALING_LLAMA3 = 3,
  CPUATTN_ROPE_SCALING_YARN = 4
} cpuattn_rope_scaling;

typedef enum cpuattn_qk_norm {
  CPUATTN_QK_NORM_NONE = 0,
  CPUATTN_QK_NORM_HEAD = 1,      /* RMSNorm over each head, weight [head_dim] */
  CPUATTN_QK_NORM_PROJECTION = 2 /* over all heads of a token, weight [heads * head_dim] */
} cpuattn_qk_norm;

typedef struct cpuattn_mha_config {
  size_t struct_size; /* sizeof(cpuattn_mha_config) */
  int64_t d_model;
  int64_t heads;
  int64_t kv_heads;  /* 0: heads */
  int64_t head_dim;  /* 0: d_model / heads */
  int64_t value_dim; /* 0: head_dim */
  /* Since C API version 5 (cpuattn::MhaConfig::rope and qk_norm; the rules are in
   * cpuattn/positional.h). rope_base 0: no rotary embedding, and the other rope_* fields are
   * ignored. A 0 in the fields below stands for the C++ default given beside it. */
  double rope_base;                   /* > 1 to rotate */
  int64_t rope_rotary_dim;            /* 0: head_dim */
  int32_t rope_style;                 /* cpuattn_rope_style */
  int32_t rope_scaling;               /* cpuattn_rope_scaling */
  double rope_factor;                 /* 0: 1 */
  int64_t rope_original_max_position; /* 0: 8192 */
  double rope_low_freq_factor;        /* 0: 1 */
  double rope_high_freq_factor;       /* 0: 4 */
  double rope_beta_fast;              /* 0: 32 */
  double rope_beta_slow;              /* 0: 1 */
  double rope_attention_factor;       /* 0: 0.1 ln factor + 1 */
  int32_t qk_norm;                    /* cpuattn_qk_norm; weights q_norm, k_norm */
  double qk_norm_eps;                 /* 0: 1e-6 */
} cpuattn_mha_config;

/* The smallest struct_size accepted: struct_size, d_model and heads. */
#define CPUATTN_MHA_CONFIG_MIN_SIZE offsetof(cpuattn_mha_config, kv_heads)

/* Weights in the x W convention (W [in, out]), f32 or bf16; biases optional (NULL), f32. The
 * layer copies them: the caller's buffers may be freed after cpuattn_mha_create. */
typedef struct cpuattn_mha_weights {
  size_t struct_size;       /* sizeof(cpuattn_mha_weights) */
  const cpuattn_tensor* wq; /* [d_model, heads * head_dim], required */
  const cpuattn_tensor* wk; /* [d_model, kv_heads * head_dim], required */
  const cpuattn_tensor* wv; /* [d_model, kv_heads * value_dim], required */
  const cpuattn_tensor* wo; /* [heads * value_dim, d_model], required */
  const cpuattn_tensor* bq; /* optional biases */
  const cpuattn_tensor* bk;
  const cpuattn_tensor* bv;
  const cpuattn_tensor* bo;
  /* Since C API version 5: QK-norm weights, f32, given exactly when config.qk_norm is set. */
  const cpuattn_tensor* q_norm;
  const cpuattn_tensor* k_norm;
} cpuattn_mha_weights;

/* The smallest struct_size accepted: struct_size and the four matrices. */
#define CPUATTN_MHA_WEIGHTS_MIN_SIZE offsetof(cpuattn_mha_weights, bq)

/* struct_size = sizeof, every other field 0 / NULL. A NULL argument is a no-op. */
CPUATTN_API void cpuattn_mha_config_init(cpuattn_mha_config* config);
CPUATTN_API void cpuattn_mha_weights_init(cpuattn_mha_weights* weights);

/* cpuattn::MultiHeadAttention. */
typedef struct cpuattn_mha cpuattn_mha;

CPUATTN_API cpuattn_status cpuattn_mha_create(const cpuattn_mha_config* config,
                                              const cpuattn_mha_weights* weights,
                                              cpuattn_mha** out);
/* NULL is a no-op. */
CPUATTN_API void cpuattn_mha_destroy(cpuattn_mha* mha);
/* The configuration with the defaults filled in. out->struct_size must be set, at least
 * CPUATTN_MHA_CONFIG_MIN_SIZE and at most 4096: the fields this library knows that lie within it
 * are written, the rest of the struct is left as it was. */
CPUATTN_API cpuattn_status cpuattn_mha_get_config(const cpuattn_mha* mha, cpuattn_mha_config* out);
/* Self-attention (causal via options->causal): x, out [B, L, d_model], each f32, bf16 or f16 (as
 * MultiHeadAttention: computed in f32, a 16-bit out rounded to nearest even). */
CPUATTN_API cpuattn_status cpuattn_mha_forward(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                               const cpuattn_tensor* out,
                                               const cpuattn_attention_options* options,
                                               cpuattn_context* context);
/* Self-attention with explicit positions for the rotary embedding (since C API version 6;
 * MultiHeadAttention::forward with positions): positions int32 or int64 [B, L], or [L] for every
 * sequence, each in [0, 2^53); an error for a layer without rope. */
CPUATTN_API cpuattn_status cpuattn_mha_forward_positions(
    const cpuattn_mha* mha, const cpuattn_tensor* x, const cpuattn_tensor* positions,
    const cpuattn_tensor* out, const cpuattn_attention_options* options, cpuattn_context* context);
/* Packed variable-length self-attention (since C API version 6; as cpuattn_attention_varlen):
 * x [T, d_model] holds sequences back to back, cu_seqlens int32 or int64 [B + 1] their offsets,
 * out [T, d_model]. positions: NULL (each sequence's own 0 .. length - 1) or int32/int64 [T]. */
CPUATTN_API cpuattn_status cpuattn_mha_forward_varlen(
    const cpuattn_mha* mha, const cpuattn_tensor* x, const cpuattn_tensor* cu_seqlens,
    const cpuattn_tensor* positions, const cpuattn_tensor* out,
    const cpuattn_attention_options* options, cpuattn_context* context);
/* Encoder-decoder attention: xq [B, Lq, d_model], xkv [B, Lk, d_model], out [B, Lq, d_model]. */
CPUATTN_API cpuattn_status cpuattn_mha_forward_cross(
    const cpuattn_mha* mha, const cpuattn_tensor* xq, const cpuattn_tensor* xkv,
    const cpuattn_tensor* out, const cpuattn_attention_options* options, cpuattn_context* context);
/* One decoding step of n new tokens, x [B, n, d_model]: appends their K/V to `cache`, then
 * attends with bottom-right causal alignment. On failure neither out nor the cache changes. */
CPUATTN_API cpuattn_status cpuattn_mha_decode(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                              cpuattn_kv_cache* cache, const cpuattn_tensor* out,
                                              const cpuattn_attention_options* options,
                                              cpuattn_context* context);
/* The same step for sequences seqs[0..n) of a paged cache (since C API version 3), x
 * [n, tokens, d_model]: appends each sequence's new tokens (taking pages as needed), then attends
 * to its pages in place. On failure (among them too few free pages) neither out nor the cache
 * changes. */
CPUATTN_API cpuattn_status cpuattn_mha_decode_paged(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                                    cpuattn_paged_kv_cache* cache,
                                                    const int64_t* seqs, int64_t n,
                                                    const cpuattn_tensor* out,
                                                    const cpuattn_attention_options* options,
                                                    cpuattn_context* context);
/* A cache shaped for this layer (kv_heads, head_dim, value_dim). */
CPUATTN_API cpuattn_status cpuattn_mha_make_cache(const cpuattn_mha* mha, int64_t batch,
                                                  int64_t capacity, int growable,
                                                  cpuattn_dtype dtype, cpuattn_kv_cache** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CPUATTN_CPUATTN_C_H_ */
