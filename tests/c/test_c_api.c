/* Tests of the C API (include/cpuattn/cpuattn_c.h), written in C99 and compiled with
 * -std=c99 -Wall -Wextra -pedantic -Werror: the header is plain C, and every entry point is
 * exercised from C. No GoogleTest: main() returns 1 when any check fails, after printing each
 * failure (file:line, the check, and the library's last error).
 *
 * Covered: results against the double-precision reference (plain, causal + key lengths + lse,
 * scale + bottom-right + mask, weights), contexts (2 threads, a target cap, the default context),
 * KV caches (append + attention, truncate, clear, int8 scales) and multi-head attention (decode
 * through a cache matches the causal forward pass), and every status code:
 *   CPUATTN_ERROR_INVALID_ARGUMENT  bad shapes (message = the C++ cpuattn::Error text), bad enums,
 *                                   struct_size rules, an absurd KV cache (1 << 50 tokens);
 *   CPUATTN_ERROR_NULL_POINTER      NULL arguments;
 *   CPUATTN_ERROR_OUT_OF_MEMORY     a KV cache of 2^38 tokens under an address-space limit
 *                                   (skipped under sanitizers, whose allocators abort instead of
 *                                   throwing std::bad_alloc);
 *   CPUATTN_ERROR_INTERNAL          cannot be triggered from outside: the C++ API throws only
 *                                   cpuattn::Error and std::bad_alloc, so the catch-all that maps
 *                                   any other exception is a safety net; only its name is checked.
 * Every failing call must leave its outputs untouched and set cpuattn_last_error(); every
 * successful one clears it. A status coming back at all shows that no exception crossed. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cpuattn/cpuattn_c.h"

/* ----------------------------------------------------------------------------- test harness */

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    ++g_checks;                                                                               \
    if (!(cond)) {                                                                            \
      ++g_failures;                                                                           \
      fprintf(stderr, "%s:%d: FAILED: %s\n  last error: \"%s\"\n", __FILE__, __LINE__, #cond, \
              cpuattn_last_error());                                                          \
    }                                                                                         \
  } while (0)

/* Runs a call and checks its status (prints both names on a mismatch). */
#define EXPECT_STATUS(expected, call)                                                              \
  do {                                                                                             \
    cpuattn_status got_ = (call);                                                                  \
    ++g_checks;                                                                                    \
    if (got_ != (expected)) {                                                                      \
      ++g_failures;                                                                                \
      fprintf(stderr, "%s:%d: FAILED: %s\n  status %s, expected %s\n  last error: \"%s\"\n",       \
              __FILE__, __LINE__, #call, cpuattn_status_name(got_), cpuattn_status_name(expected), \
              cpuattn_last_error());                                                               \
    }                                                                                              \
  } while (0)

#define EXPECT_OK(call) EXPECT_STATUS(CPUATTN_OK, call)

static int starts_with(const char* s, const char* prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}
static int contains(const char* s, const char* part) { return strstr(s, part) != NULL; }

/* What a scalar cap runs and reports: on aarch64 NEON is the baseline every unit is compiled for
 * (docs/architecture.md#arm), so the lowest target there is neon. */
#if defined(__aarch64__)
static const cpuattn_target kLowestTarget = CPUATTN_TARGET_NEON;
static const char* const kLowestName = "neon";
#else
static const cpuattn_target kLowestTarget = CPUATTN_TARGET_SCALAR;
static const char* const kLowestName = "scalar";
#endif

/* A failed call's message: starts with "cpuattn: " and contains `part`. */
#define EXPECT_MESSAGE(part)                                                                    \
  do {                                                                                          \
    const char* msg_ = cpuattn_last_error();                                                    \
    CHECK(starts_with(msg_, "cpuattn: "));                                                      \
    ++g_checks;                                                                                 \
    if (!contains(msg_, part)) {                                                                \
      ++g_failures;                                                                             \
      fprintf(stderr, "%s:%d: FAILED: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, msg_, \
              part);                                                                            \
    }                                                                                           \
  } while (0)

/* ------------------------------------------------------------------------------ helpers */

static uint32_t g_seed = 12345u;
/* Uniform in [-1, 1), a fixed-seed LCG (the same data on every run and platform). */
static float rnd(void) {
  g_seed = g_seed * 1664525u + 1013904223u;
  return (float)((g_seed >> 8) & 0xFFFFFFu) / 8388608.0f - 1.0f;
}

static float* random_floats(size_t n, float amplitude) {
  size_t i;
  float* p = (float*)malloc(n * sizeof(float));
  if (p == NULL) {
    fprintf(stderr, "malloc failed\n");
    exit(2);
  }
  for (i = 0; i < n; ++i) p[i] = amplitude * rnd();
  return p;
}

static float* filled(size_t n, float value) {
  size_t i;
  float* p = (float*)malloc(n * sizeof(float));
  if (p == NULL) {
    fprintf(stderr, "malloc failed\n");
    exit(2);
  }
  for (i = 0; i < n; ++i) p[i] = value;
  return p;
}

static const float kSentinel = 12345.0f;

static int all_equal(const float* p, size_t n, float value) {
  size_t i;
  for (i = 0; i < n; ++i)
    if (p[i] != value) return 0;
  return 1;
}

/* |got - want| <= atol + rtol * |want| for every element (matching infinities too); prints the
 * first mismatch. */
static int close_to(const float* got, const float* want, size_t n, double rtol, double atol,
                    const char* what) {
  size_t i;
  for (i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (isinf(w) && g == w) continue;
    if (!(fabs(g - w) <= atol + rtol * fabs(w))) {
      fprintf(stderr, "  %s: element %lu: got %.9g, want %.9g\n", what, (unsigned long)i, g, w);
      return 0;
    }
  }
  return 1;
}

static cpuattn_tensor tensor(void* data, cpuattn_dtype dtype, int rank, int64_t a, int64_t b,
                             int64_t c, int64_t d) {
  cpuattn_tensor t;
  int64_t shape[4];
  shape[0] = a;
  shape[1] = b;
  shape[2] = c;
  shape[3] = d;
  memset(&t, 0, sizeof t);
  if (cpuattn_tensor_contiguous(&t, data, dtype, rank, shape) != CPUATTN_OK) {
    fprintf(stderr, "cpuattn_tensor_contiguous failed: %s\n", cpuattn_last_error());
    exit(2);
  }
  return t;
}

static cpuattn_tensor f32_4d(float* data, int64_t a, int64_t b, int64_t c, int64_t d) {
  return tensor(data, CPUATTN_DTYPE_F32, 4, a, b, c, d);
}
static cpuattn_tensor f32_3d(float* data, int64_t a, int64_t b, int64_t c) {
  return tensor(data, CPUATTN_DTYPE_F32, 3, a, b, c, 0);
}

/* Relative tolerance of the f32 fast path against the double reference. */
static const double kRtol = 1e-4, kAtol = 2e-5;

/* ---------------------------------------------------------------------------- basics */

static void test_version_and_names(void) {
  int major = -1, minor = -1, patch = -1;
  char buf[64];
  cpuattn_version(&major, &minor, &patch);
  CHECK(major == 0 && minor == 1 && patch == 0);
  sprintf(buf, "%d.%d.%d", major, minor, patch);
  CHECK(strcmp(buf, cpuattn_version_string()) == 0);
  cpuattn_version(NULL, NULL, NULL); /* NULLs are skipped */
  CHECK(cpuattn_c_api_version() == CPUATTN_C_API_VERSION);

  CHECK(strcmp(cpuattn_status_name(CPUATTN_OK), "ok") == 0);
  CHECK(strcmp(cpuattn_status_name(CPUATTN_ERROR_INVALID_ARGUMENT), "invalid_argument") == 0);
  CHECK(strcmp(cpuattn_status_name(CPUATTN_ERROR_OUT_OF_MEMORY), "out_of_memory") == 0);
  CHECK(strcmp(cpuattn_status_name(CPUATTN_ERROR_NULL_POINTER), "null_pointer") == 0);
  CHECK(strcmp(cpuattn_status_name(CPUATTN_ERROR_INTERNAL), "internal") == 0);
  CHECK(strcmp(cpuattn_status_name((cpuattn_status)77), "unknown") == 0);
  CHECK(strcmp(cpuattn_status_name((cpuattn_status)-1), "unknown") == 0);

  CHECK(strcmp(cpuattn_dtype_name(CPUATTN_DTYPE_F32), "float32") == 0);
  CHECK(strcmp(cpuattn_dtype_name(CPUATTN_DTYPE_BF16), "bfloat16") == 0);
  CHECK(strcmp(cpuattn_dtype_name(CPUATTN_DTYPE_I8), "int8") == 0);
  CHECK(strcmp(cpuattn_dtype_name((cpuattn_dtype)99), "unknown") == 0);
  CHECK(strcmp(cpuattn_target_name(CPUATTN_TARGET_SCALAR), "scalar") == 0);
  CHECK(strcmp(cpuattn_target_name(CPUATTN_TARGET_AVX512_BF16), "avx512_bf16") == 0);
  CHECK(strcmp(cpuattn_target_name(CPUATTN_TARGET_AVX512_VNNI), "avx512_vnni") == 0);
  CHECK(strcmp(cpuattn_target_name((cpuattn_target)9), "unknown") == 0);
  CHECK(strcmp(cpuattn_target_name(CPUATTN_TARGET_BEST), "best") == 0);
  CHECK(strcmp(cpuattn_target_name((cpuattn_target)-3), "unknown") == 0);
  CHECK(cpuattn_last_error() != NULL);
}

static void test_tensor_helpers(void) {
  float x[2 * 3 * 4 * 5];
  int64_t shape[3] = {3, 4, 5};
  cpuattn_tensor t;
  EXPECT_OK(cpuattn_tensor_contiguous(&t, x, CPUATTN_DTYPE_F32, 3, shape));
  CHECK(t.data == (void*)x && t.dtype == CPUATTN_DTYPE_F32 && t.rank == 3);
  CHECK(t.shape[0] == 3 && t.shape[1] == 4 && t.shape[2] == 5);
  CHECK(t.strides[0] == 20 && t.strides[1] == 5 && t.strides[2] == 1);
  EXPECT_OK(cpuattn_tensor_contiguous(&t, x, CPUATTN_DTYPE_F32, 0, NULL));
  CHECK(t.rank == 0);

  /* [B, H, L, D] view of [B, L, H, D] memory: B=2, L=3, H=4, D=5. */
  EXPECT_OK(cpuattn_tensor_blhd(&t, x, CPUATTN_DTYPE_F32, 2, 3, 4, 5));
  CHECK(t.rank == 4 && t.shape[0] == 2 && t.shape[1] == 4 && t.shape[2] == 3 && t.shape[3] == 5);
  CHECK(t.strides[0] == 60 && t.strides[1] == 5 && t.strides[2] == 20 && t.strides[3] == 1);

  /* Failures leave the descriptor alone. */
  t.rank = 42;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_tensor_contiguous(&t, x, CPUATTN_DTYPE_F32, 5, shape));
  EXPECT_MESSAGE("rank 5");
  CHECK(t.rank == 42);
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_tensor_contiguous(&t, x, (cpuattn_dtype)99, 3, shape));
  EXPECT_MESSAGE("dtype 99");
  CHECK(t.rank == 42);
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                cpuattn_tensor_contiguous(&t, x, CPUATTN_DTYPE_F32, 2, NULL));
  EXPECT_MESSAGE("shape is NULL");
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                cpuattn_tensor_contiguous(NULL, x, CPUATTN_DTYPE_F32, 3, shape));
  EXPECT_MESSAGE("tensor is NULL");
  shape[0] = 2;
  shape[1] = INT64_MAX / 2;
  shape[2] = 3;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_tensor_contiguous(&t, x, CPUATTN_DTYPE_F32, 3, shape));
  EXPECT_MESSAGE("overflow 64 bits");
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_tensor_blhd(&t, x, CPUATTN_DTYPE_F32, 2, INT64_MAX, 4, 5));
  EXPECT_MESSAGE("overflow");
  CHECK(t.rank == 42);
}

/* ------------------------------------------------------------------------- attention */

enum { B = 2, H = 4, HKV = 2, LQ = 5, LK = 7, D = 8, DV = 6 };
#define NQ ((size_t)B * H * LQ * D)
#define NK ((size_t)B * HKV * LK * D)
#define NV ((size_t)B * HKV * LK * DV)
#define NO ((size_t)B * H * LQ * DV)
#define NL ((size_t)B * H * LQ)

/* Runs the fast path (with `ctx`) and the reference on the same arguments and compares out
 * (and lse, when `with_lse`). */
static void compare_with_reference(const char* what, cpuattn_attention_options* opts,
                                   cpuattn_context* ctx, int with_lse) {
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* want = filled(NO, -kSentinel);
  float* lse = filled(NL, kSentinel);
  float* want_lse = filled(NL, -kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV);
  cpuattn_tensor to = f32_4d(out, B, H, LQ, DV), tw = f32_4d(want, B, H, LQ, DV);
  cpuattn_tensor tl = f32_3d(lse, B, H, LQ), twl = f32_3d(want_lse, B, H, LQ);

  if (opts && with_lse) opts->lse = &tl;
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, opts, ctx));
  CHECK(cpuattn_last_error()[0] == '\0');
  if (opts && with_lse) opts->lse = &twl;
  EXPECT_OK(cpuattn_reference_attention(&tq, &tk, &tv, &tw, opts));
  if (opts) opts->lse = NULL;
  if (!close_to(out, want, NO, kRtol, kAtol, what)) {
    ++g_failures;
    fprintf(stderr, "FAILED: %s: fast path differs from the reference\n", what);
  }
  ++g_checks;
  if (with_lse) {
    ++g_checks;
    if (!close_to(lse, want_lse, NL, kRtol, kAtol, what)) {
      ++g_failures;
      fprintf(stderr, "FAILED: %s: lse differs from the reference\n", what);
    }
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(want);
  free(lse);
  free(want_lse);
}

static void test_attention_matches_reference(void) {
  cpuattn_attention_options opts;
  int32_t lengths[B] = {LK, 3};
  int32_t zero_lengths[B] = {LK, 0};
  unsigned char mask[LQ * LK];
  cpuattn_tensor tlen = tensor(lengths, CPUATTN_DTYPE_I32, 1, B, 0, 0, 0);
  cpuattn_tensor tzero = tensor(zero_lengths, CPUATTN_DTYPE_I32, 1, B, 0, 0, 0);
  cpuattn_tensor tmask = tensor(mask, CPUATTN_DTYPE_BOOL, 2, LQ, LK, 0, 0);
  int i;
  for (i = 0; i < LQ * LK; ++i) mask[i] = (unsigned char)((i * 7 + 3) % 4 != 0);
  for (i = 0; i < LQ; ++i) mask[i * LK] = 1; /* every row keeps key 0 */

  compare_with_reference("no options", NULL, NULL, 0);

  cpuattn_attention_options_init(&opts);
  CHECK(opts.struct_size == sizeof(cpuattn_attention_options));
  CHECK(opts.has_scale == 0 && opts.causal == CPUATTN_CAUSAL_NONE && opts.mask == NULL &&
        opts.key_lengths == NULL && opts.lse == NULL && opts.weights == NULL);
  compare_with_reference("default options + lse", &opts, NULL, 1);

  opts.causal = CPUATTN_CAUSAL_TOP_LEFT;
  opts.key_lengths = &tlen;
  compare_with_reference("causal top-left + key_lengths + lse", &opts, NULL, 1);

  /* A fully masked row: out 0, lse -inf, in both. */
  opts.key_lengths = &tzero;
  compare_with_reference("key_lengths 0 + lse", &opts, NULL, 1);

  cpuattn_attention_options_init(&opts);
  opts.has_scale = 1;
  opts.scale = 0.5;
  opts.causal = CPUATTN_CAUSAL_BOTTOM_RIGHT;
  opts.mask = &tmask;
  compare_with_reference("scale 0.5 + bottom-right + bool mask + lse", &opts, NULL, 1);
}

/* The weights output: each row sums to 1 and the call matches the reference. */
static void test_weights_output(void) {
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* w = filled((size_t)B * H * LQ * LK, kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_tensor tw = f32_4d(w, B, H, LQ, LK);
  cpuattn_attention_options opts;
  size_t row;
  cpuattn_attention_options_init(&opts);
  opts.causal = CPUATTN_CAUSAL_TOP_LEFT;
  opts.weights = &tw;
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  for (row = 0; row < (size_t)B * H * LQ; ++row) {
    double sum = 0;
    int j;
    for (j = 0; j < LK; ++j) sum += w[row * LK + j];
    CHECK(fabs(sum - 1.0) < 1e-5);
    CHECK(w[row * LK + LK - 1] == 0.0f); /* causal top-left, Lq < Lk: the last key is unseen */
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(w);
}

/* ---------------------------------------------------------------------------- contexts */

static void test_contexts(void) {
  cpuattn_context* ctx = NULL;
  cpuattn_target t = CPUATTN_TARGET_BEST, saved = CPUATTN_TARGET_BEST;
  const char* targets = NULL;
  int threads = -1;
  cpuattn_attention_options opts;

  EXPECT_OK(cpuattn_context_create(2, &ctx));
  CHECK(ctx != NULL);
  EXPECT_OK(cpuattn_context_num_threads(ctx, &threads));
  CHECK(threads == 2);
  EXPECT_OK(cpuattn_context_max_target(ctx, &t));
  CHECK(t == CPUATTN_TARGET_BEST);

  EXPECT_OK(cpuattn_supported_targets(&targets));
  CHECK(targets != NULL && contains(targets, kLowestName));

  /* Capped to scalar: that is what runs, and the result still matches the reference. */
  EXPECT_OK(cpuattn_context_set_max_target(ctx, CPUATTN_TARGET_SCALAR));
  EXPECT_OK(cpuattn_context_max_target(ctx, &t));
  CHECK(t == CPUATTN_TARGET_SCALAR);
  EXPECT_OK(cpuattn_active_target(ctx, &t));
  CHECK(t == kLowestTarget);
  cpuattn_attention_options_init(&opts);
  opts.causal = CPUATTN_CAUSAL_TOP_LEFT;
  compare_with_reference("2 threads, scalar cap", &opts, ctx, 1);

  /* Uncapped: the best target of this machine, the first one supported_targets names. */
  EXPECT_OK(cpuattn_context_set_max_target(ctx, CPUATTN_TARGET_BEST));
  EXPECT_OK(cpuattn_active_target(ctx, &t));
  CHECK(starts_with(targets, cpuattn_target_name(t)));
  compare_with_reference("2 threads, best target", &opts, ctx, 1);

  /* An unknown target is an error that changes nothing. */
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_context_set_max_target(ctx, (cpuattn_target)99));
  EXPECT_MESSAGE("target 99");
  EXPECT_OK(cpuattn_context_max_target(ctx, &t));
  CHECK(t == CPUATTN_TARGET_BEST);

  /* Negative thread counts: the C++ Context throws; *out stays as it was. */
  {
    cpuattn_context* before = ctx;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_context_create(-1, &ctx));
    EXPECT_MESSAGE("num_threads must be >= 0");
    CHECK(ctx == before);
  }

  /* NULL context = the default context (0 threads: the caller's arena). */
  EXPECT_OK(cpuattn_context_num_threads(NULL, &threads));
  CHECK(threads == 0);
  EXPECT_OK(cpuattn_context_max_target(NULL, &saved));
  EXPECT_OK(cpuattn_context_set_max_target(NULL, CPUATTN_TARGET_SCALAR));
  EXPECT_OK(cpuattn_active_target(NULL, &t));
  CHECK(t == kLowestTarget);
  compare_with_reference("default context, scalar cap", &opts, NULL, 1);
  EXPECT_OK(cpuattn_context_set_max_target(NULL, saved));

  cpuattn_context_destroy(ctx);
  cpuattn_context_destroy(NULL);
}

/* --------------------------------------------------------------------------- KV caches */

static void test_kv_cache_and_attention(void) {
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* want = filled(NO, -kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_tensor tw = f32_4d(want, B, H, LQ, DV);
  cpuattn_tensor k1, v1, k2, v2, keys, values, scales;
  cpuattn_kv_cache* cache = NULL;
  int64_t n = -1;

  /* Growable, capacity 3: grows while 4 + 3 tokens are appended as strided slices. */
  EXPECT_OK(cpuattn_kv_cache_create(B, HKV, D, DV, 3, 1, CPUATTN_DTYPE_F32, &cache));
  k1 = tk;
  k1.shape[2] = 4;
  v1 = tv;
  v1.shape[2] = 4;
  k2 = tk;
  k2.data = k + 4 * D;
  k2.shape[2] = 3;
  v2 = tv;
  v2.data = v + 4 * DV;
  v2.shape[2] = 3;
  EXPECT_OK(cpuattn_kv_cache_append(cache, &k1, &v1));
  EXPECT_OK(cpuattn_kv_cache_append(cache, &k2, &v2));
  EXPECT_OK(cpuattn_kv_cache_length(cache, &n));
  CHECK(n == LK);
  EXPECT_OK(cpuattn_kv_cache_capacity(cache, &n));
  CHECK(n >= LK);

  EXPECT_OK(cpuattn_kv_cache_keys(cache, &keys));
  EXPECT_OK(cpuattn_kv_cache_values(cache, &values));
  CHECK(keys.rank == 4 && keys.shape[0] == B && keys.shape[1] == HKV && keys.shape[2] == LK &&
        keys.shape[3] == D && keys.dtype == CPUATTN_DTYPE_F32);
  CHECK(values.rank == 4 && values.shape[2] == LK && values.shape[3] == DV);
  CHECK(((const float*)keys.data)[keys.strides[0] + 2 * keys.strides[2] + 1] ==
        k[(size_t)1 * HKV * LK * D + 2 * D + 1]);
  EXPECT_OK(cpuattn_kv_cache_key_scales(cache, &scales));
  CHECK(scales.data == NULL && scales.rank == 0); /* f32 cache: no scales */

  /* Attention over the cache's views = attention over the original K and V. */
  EXPECT_OK(cpuattn_attention(&tq, &keys, &values, &to, NULL, NULL));
  EXPECT_OK(cpuattn_reference_attention(&tq, &tk, &tv, &tw, NULL));
  ++g_checks;
  if (!close_to(out, want, NO, kRtol, kAtol, "attention over a KV cache")) {
    ++g_failures;
    fprintf(stderr, "FAILED: attention over a KV cache differs from the reference\n");
  }

  /* truncate / clear; truncating past the length is an error that changes nothing. */
  EXPECT_OK(cpuattn_kv_cache_truncate(cache, 4));
  EXPECT_OK(cpuattn_kv_cache_length(cache, &n));
  CHECK(n == 4);
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_kv_cache_truncate(cache, 10));
  EXPECT_MESSAGE("truncate(10)");
  EXPECT_OK(cpuattn_kv_cache_length(cache, &n));
  CHECK(n == 4);
  EXPECT_OK(cpuattn_kv_cache_clear(cache));
  EXPECT_OK(cpuattn_kv_cache_length(cache, &n));
  CHECK(n == 0);
  EXPECT_OK(cpuattn_kv_cache_reserve(cache, 64));
  EXPECT_OK(cpuattn_kv_cache_capacity(cache, &n));
  CHECK(n >= 64);
  cpuattn_kv_cache_destroy(cache);
  cpuattn_kv_cache_destroy(NULL);

  /* A fixed cache that would overflow: an error, nothing stored. */
  EXPECT_OK(cpuattn_kv_cache_create(B, HKV, D, DV, 5, 0, CPUATTN_DTYPE_F32, &cache));
  EXPECT_OK(cpuattn_kv_cache_append(cache, &k1, &v1));
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_kv_cache_append(cache, &k2, &v2));
  EXPECT_MESSAGE("capacity 5");
  EXPECT_OK(cpuattn_kv_cache_length(cache, &n));
  CHECK(n == 4);
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_kv_cache_reserve(cache, 100));
  cpuattn_kv_cache_destroy(cache);

  /* int8: scales are there, and attention with them matches the reference within int8 error. */
  {
    cpuattn_tensor vscales;
    cpuattn_attention_options opts;
    EXPECT_OK(cpuattn_kv_cache_create(B, HKV, D, DV, LK, 0, CPUATTN_DTYPE_I8, &cache));
    EXPECT_OK(cpuattn_kv_cache_append(cache, &tk, &tv));
    EXPECT_OK(cpuattn_kv_cache_keys(cache, &keys));
    EXPECT_OK(cpuattn_kv_cache_values(cache, &values));
    EXPECT_OK(cpuattn_kv_cache_key_scales(cache, &scales));
    EXPECT_OK(cpuattn_kv_cache_value_scales(cache, &vscales));
    CHECK(keys.dtype == CPUATTN_DTYPE_I8 && values.dtype == CPUATTN_DTYPE_I8);
    CHECK(scales.data != NULL && scales.dtype == CPUATTN_DTYPE_F32 && scales.rank == 3 &&
          scales.shape[2] == LK);
    CHECK(vscales.data != NULL && vscales.rank == 3);
    /* Without the scales: the C++ API's error about k_scales. */
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_attention(&tq, &keys, &values, &to, NULL, NULL));
    EXPECT_MESSAGE("k_scales");
    cpuattn_attention_options_init(&opts);
    opts.k_scales = &scales;
    opts.v_scales = &vscales;
    EXPECT_OK(cpuattn_attention(&tq, &keys, &values, &to, &opts, NULL));
    ++g_checks;
    if (!close_to(out, want, NO, 0.0, 0.03, "int8 KV cache")) {
      ++g_failures;
      fprintf(stderr, "FAILED: attention over an int8 KV cache differs from the reference\n");
    }
    cpuattn_kv_cache_destroy(cache);
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(want);
}

/* Caches with static scales (C API version 4), for every scaled dtype the library lists: the
 * loop asks the library which dtypes exist (cpuattn_dtype_name) and which take scales (only
 * those accept them), so a new scaled dtype is tested here unchanged. Per-head scales: the
 * scales views are [kv_heads]; attention over the contiguous and paged caches matches the
 * reference on the same stored values. */
static void test_scaled_caches(void) {
  const float ks[HKV] = {0.01f, 0.02f}, vs[HKV] = {0.015f, 0.0125f};
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* want = filled(NO, -kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_tensor tw = f32_4d(want, B, H, LQ, DV);
  int scaled = 0;
  int d;
  for (d = 0; strcmp(cpuattn_dtype_name((cpuattn_dtype)d), "unknown") != 0; ++d) {
    cpuattn_kv_cache* cache = NULL;
    cpuattn_tensor keys, values, kscales, vscales;
    cpuattn_attention_options opts;
    char what[64];
    const cpuattn_status st =
        cpuattn_kv_cache_create_scaled(B, HKV, D, DV, LK, 0, (cpuattn_dtype)d, ks, vs, HKV, &cache);
    if (st != CPUATTN_OK) {
      EXPECT_MESSAGE("dtype"); /* not a cache dtype, or one that takes no scales */
      continue;
    }
    ++scaled;
    EXPECT_OK(cpuattn_kv_cache_append(cache, &tk, &tv));
    EXPECT_OK(cpuattn_kv_cache_keys(cache, &keys));
    EXPECT_OK(cpuattn_kv_cache_values(cache, &values));
    EXPECT_OK(cpuattn_kv_cache_key_scales(cache, &kscales));
    EXPECT_OK(cpuattn_kv_cache_value_scales(cache, &vscales));
    CHECK(keys.dtype == (cpuattn_dtype)d && kscales.rank == 1 && kscales.shape[0] == HKV &&
          ((const float*)kscales.data)[1] == ks[1] && ((const float*)vscales.data)[0] == vs[0]);
    cpuattn_attention_options_init(&opts);
    opts.k_scales = &kscales;
    opts.v_scales = &vscales;
    EXPECT_OK(cpuattn_attention(&tq, &keys, &values, &to, &opts, NULL));
    EXPECT_OK(cpuattn_reference_attention(&tq, &keys, &values, &tw, &opts));
    snprintf(what, sizeof what, "%s cache, static scales", cpuattn_dtype_name((cpuattn_dtype)d));
    CHECK(close_to(out, want, NO, kRtol, 3e-3, what));
    cpuattn_kv_cache_destroy(cache);
    {
      /* The same through a paged cache with one scale for every head. */
      cpuattn_paged_kv_cache* pc = NULL;
      cpuattn_paged_kv kv;
      int64_t seq[B];
      int b;
      EXPECT_OK(cpuattn_paged_kv_cache_create_scaled(32, 4, HKV, D, DV, (cpuattn_dtype)d, ks, vs, 1,
                                                     &pc));
      for (b = 0; b < B; ++b) {
        cpuattn_tensor kb = f32_3d(k + (size_t)b * HKV * LK * D, HKV, LK, D);
        cpuattn_tensor vb = f32_3d(v + (size_t)b * HKV * LK * DV, HKV, LK, DV);
        EXPECT_OK(cpuattn_paged_kv_cache_add_sequence(pc, &seq[b]));
        EXPECT_OK(cpuattn_paged_kv_cache_append(pc, seq[b], &kb, &vb));
      }
      cpuattn_paged_kv_init(&kv);
      EXPECT_OK(cpuattn_paged_kv_cache_batch(pc, seq, B, &kv));
      CHECK(kv.k_scales.rank == 1 && kv.k_pages.dtype == (cpuattn_dtype)d);
      EXPECT_OK(cpuattn_attention_paged(&tq, &kv, &to, NULL, NULL));
      EXPECT_OK(cpuattn_reference_attention_paged(&tq, &kv, &tw, NULL));
      snprintf(what, sizeof what, "%s paged cache, static scales",
               cpuattn_dtype_name((cpuattn_dtype)d));
      CHECK(close_to(out, want, NO, kRtol, 3e-3, what));
      cpuattn_paged_kv_cache_destroy(pc);
    }
  }
  CHECK(scaled >= 1);
  /* Bad scales: a wrong count, a zero scale, NULL pointers with a count. */
  {
    cpuattn_kv_cache* cache = NULL;
    const float zero[2] = {0.0f, 1.0f};
    EXPECT_STATUS(
        CPUATTN_ERROR_INVALID_ARGUMENT,
        cpuattn_kv_cache_create_scaled(B, HKV, D, DV, LK, 0, CPUATTN_DTYPE_I8, ks, vs, 3, &cache));
    EXPECT_MESSAGE("kv_heads");
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_kv_cache_create_scaled(B, HKV, D, DV, LK, 0, CPUATTN_DTYPE_I8, zero, vs,
                                                 2, &cache));
    EXPECT_MESSAGE("finite and > 0");
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                  cpuattn_kv_cache_create_scaled(B, HKV, D, DV, LK, 0, CPUATTN_DTYPE_I8, NULL, vs,
                                                 2, &cache));
    EXPECT_MESSAGE("k_scales");
    CHECK(cache == NULL);
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(want);
}

/* -------------------------------------------------------------------- multi-head attention */

enum { DM = 16, MH = 4, MHKV = 2, HD = 4, MB = 2, T = 6 };

typedef struct mha_fixture {
  float *wq, *wk, *wv, *wo, *bq, *bo;
  cpuattn_tensor twq, twk, twv, two, tbq, tbo;
  cpuattn_mha_config config;
  cpuattn_mha_weights weights;
} mha_fixture;

static void mha_fixture_init(mha_fixture* f) {
  f->wq = random_floats((size_t)DM * MH * HD, 0.4f);
  f->wk = random_floats((size_t)DM * MHKV * HD, 0.4f);
  f->wv = random_floats((size_t)DM * MHKV * HD, 0.4f);
  f->wo = random_floats((size_t)MH * HD * DM, 0.4f);
  f->bq = random_floats((size_t)MH * HD, 0.1f);
  f->bo = random_floats((size_t)DM, 0.1f);
  f->twq = tensor(f->wq, CPUATTN_DTYPE_F32, 2, DM, MH * HD, 0, 0);
  f->twk = tensor(f->wk, CPUATTN_DTYPE_F32, 2, DM, MHKV * HD, 0, 0);
  f->twv = tensor(f->wv, CPUATTN_DTYPE_F32, 2, DM, MHKV * HD, 0, 0);
  f->two = tensor(f->wo, CPUATTN_DTYPE_F32, 2, MH * HD, DM, 0, 0);
  f->tbq = tensor(f->bq, CPUATTN_DTYPE_F32, 1, MH * HD, 0, 0, 0);
  f->tbo = tensor(f->bo, CPUATTN_DTYPE_F32, 1, DM, 0, 0, 0);
  cpuattn_mha_config_init(&f->config);
  f->config.d_model = DM;
  f->config.heads = MH;
  f->config.kv_heads = MHKV;
  cpuattn_mha_weights_init(&f->weights);
  f->weights.wq = &f->twq;
  f->weights.wk = &f->twk;
  f->weights.wv = &f->twv;
  f->weights.wo = &f->two;
  f->weights.bq = &f->tbq;
  f->weights.bo = &f->tbo;
}

static void mha_fixture_free(mha_fixture* f) {
  free(f->wq);
  free(f->wk);
  free(f->wv);
  free(f->wo);
  free(f->bq);
  free(f->bo);
}

/* A decoder layer from C (since C API version 5): Llama 3 rotary embedding and per-head QK-norm.
 * Decoding token by token gives the rows of the causal forward pass (keys cached rotated), the
 * rotation changes the output, and get_config reports the rotary fields with defaults filled in. */
static void test_mha_rope_and_qk_norm(void) {
  mha_fixture f;
  cpuattn_mha *mha = NULL, *plain = NULL;
  cpuattn_mha_config got;
  cpuattn_kv_cache* cache = NULL;
  float* qn = random_floats(HD, 0.5f);
  float* kn = random_floats(HD, 0.5f);
  float* x = random_floats((size_t)MB * T * DM, 1.0f);
  float* want = filled((size_t)MB * T * DM, kSentinel);
  float* out = filled((size_t)MB * T * DM, kSentinel);
  float* unrotated = filled((size_t)MB * T * DM, kSentinel);
  cpuattn_tensor tx = f32_3d(x, MB, T, DM), twant = f32_3d(want, MB, T, DM);
  cpuattn_tensor tun = f32_3d(unrotated, MB, T, DM);
  cpuattn_tensor tqn = tensor(qn, CPUATTN_DTYPE_F32, 1, HD, 0, 0, 0);
  cpuattn_tensor tkn = tensor(kn, CPUATTN_DTYPE_F32, 1, HD, 0, 0, 0);
  cpuattn_attention_options causal;
  int64_t pos, i;
  for (i = 0; i < HD; ++i) {
    qn[i] += 1.0f;
    kn[i] += 1.0f;
  }
  mha_fixture_init(&f);
  EXPECT_OK(cpuattn_mha_create(&f.config, &f.weights, &plain));
  f.config.rope_base = 500000.0;
  f.config.rope_scaling = CPUATTN_ROPE_SCALING_LLAMA3;
  f.config.rope_factor = 8;
  f.config.rope_original_max_position = 4;
  f.config.qk_norm = CPUATTN_QK_NORM_HEAD;
  f.weights.q_norm = &tqn;
  f.weights.k_norm = &tkn;
  EXPECT_OK(cpuattn_mha_create(&f.config, &f.weights, &mha));
  cpuattn_mha_config_init(&got);
  EXPECT_OK(cpuattn_mha_get_config(mha, &got));
  CHECK(got.rope_base == 500000.0 && got.rope_scaling == CPUATTN_ROPE_SCALING_LLAMA3 &&
        got.rope_factor == 8 && got.rope_original_max_position == 4 &&
        got.rope_high_freq_factor == 4 && got.rope_beta_fast == 32 &&
        got.qk_norm == CPUATTN_QK_NORM_HEAD && got.qk_norm_eps == 1e-6);

  cpuattn_attention_options_init(&causal);
  causal.causal = CPUATTN_CAUSAL_TOP_LEFT;
  EXPECT_OK(cpuattn_mha_forward(mha, &tx, &twant, &causal, NULL));
  f.weights.q_norm = f.weights.k_norm = NULL;
  EXPECT_OK(cpuattn_mha_forward(plain, &tx, &tun, &causal, NULL));
  ++g_checks;
  if (close_to(unrotated, want, (size_t)MB * T * DM, kRtol, kAtol,
               "rope vs the plain layer (expected to differ)")) {
    ++g_failures;
    fprintf(stderr, "FAILED: the rotary layer gives the plain layer's output\n");
  }
  EXPECT_OK(cpuattn_mha_make_cache(mha, MB, T, 0, CPUATTN_DTYPE_F32, &cache));
  for (pos = 0; pos < T; ++pos) {
    cpuattn_tensor xs = tx, os = f32_3d(out, MB, T, DM);
    xs.data = x + pos * DM;
    xs.shape[1] = 1;
    os.data = out + pos * DM;
    os.shape[1] = 1;
    EXPECT_OK(cpuattn_mha_decode(mha, &xs, cache, &os, NULL, NULL));
  }
  ++g_checks;
  if (!close_to(out, want, (size_t)MB * T * DM, kRtol, kAtol, "rope decode")) {
    ++g_failures;
    fprintf(stderr, "FAILED: rotary decode differs from the causal forward pass\n");
  }
  cpuattn_kv_cache_destroy(cache);

  /* Since version 6: explicit positions (0 .. T-1 as one [T] row: the implicit ones) and the
   * packed forward of the MB sequences back to back give the causal forward's rows; positions
   * for a layer without rope are an error naming them. */
  {
    int64_t* ids = (int64_t*)malloc(sizeof(int64_t) * T);
    int64_t cu[MB + 1];
    int64_t b;
    cpuattn_tensor tids, tcu, x2 = tensor(x, CPUATTN_DTYPE_F32, 2, MB * T, DM, 0, 0);
    cpuattn_tensor o2 = tensor(out, CPUATTN_DTYPE_F32, 2, MB * T, DM, 0, 0);
    cpuattn_tensor tout = f32_3d(out, MB, T, DM);
    for (i = 0; i < T; ++i) ids[i] = i;
    for (b = 0; b <= MB; ++b) cu[b] = b * T;
    tids = tensor(ids, CPUATTN_DTYPE_I64, 1, T, 0, 0, 0);
    tcu = tensor(cu, CPUATTN_DTYPE_I64, 1, MB + 1, 0, 0, 0);
    EXPECT_OK(cpuattn_mha_forward_positions(mha, &tx, &tids, &tout, &causal, NULL));
    ++g_checks;
    if (!close_to(out, want, (size_t)MB * T * DM, kRtol, kAtol, "explicit positions")) {
      ++g_failures;
      fprintf(stderr, "FAILED: positions 0 .. T-1 differ from the implicit ones\n");
    }
    EXPECT_OK(cpuattn_mha_forward_varlen(mha, &x2, &tcu, NULL, &o2, &causal, NULL));
    ++g_checks;
    if (!close_to(out, want, (size_t)MB * T * DM, kRtol, kAtol, "forward_varlen")) {
      ++g_failures;
      fprintf(stderr, "FAILED: the packed forward differs from the batched one\n");
    }
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_mha_forward_positions(plain, &tx, &tids, &tout, &causal, NULL));
    EXPECT_MESSAGE("positions");
    free(ids);
  }

  /* Bad values are the C++ constructor's errors, naming the field; nothing is created. */
  {
    cpuattn_mha* none = (cpuattn_mha*)&tx;
    f.config.qk_norm = 7;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_create(&f.config, &f.weights, &none));
    EXPECT_MESSAGE("qk_norm");
    f.config.qk_norm = CPUATTN_QK_NORM_HEAD;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_create(&f.config, &f.weights, &none));
    EXPECT_MESSAGE("q_norm is required");
    f.config.qk_norm = CPUATTN_QK_NORM_NONE;
    f.config.rope_rotary_dim = 3;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_create(&f.config, &f.weights, &none));
    EXPECT_MESSAGE("rope.rotary_dim");
    CHECK(none == (cpuattn_mha*)&tx);
  }
  cpuattn_mha_destroy(mha);
  cpuattn_mha_destroy(plain);
  mha_fixture_free(&f);
  free(qn);
  free(kn);
  free(x);
  free(want);
  free(out);
  free(unrotated);
}

/* Decoding 3 + 1 + 2 tokens through a KV cache gives the rows of one causal forward pass. */
static void test_mha_decode_matches_forward(void) {
  mha_fixture f;
  cpuattn_mha* mha = NULL;
  cpuattn_mha_config got;
  float* x = random_floats((size_t)MB * T * DM, 1.0f);
  float* want = filled((size_t)MB * T * DM, kSentinel);
  float* out = filled((size_t)MB * T * DM, kSentinel);
  cpuattn_tensor tx = f32_3d(x, MB, T, DM), twant = f32_3d(want, MB, T, DM);
  cpuattn_attention_options causal;
  cpuattn_context* ctx = NULL;
  int growable;
  mha_fixture_init(&f);

  EXPECT_OK(cpuattn_mha_create(&f.config, &f.weights, &mha));
  CHECK(mha != NULL);
  cpuattn_mha_config_init(&got);
  EXPECT_OK(cpuattn_mha_get_config(mha, &got));
  CHECK(got.d_model == DM && got.heads == MH && got.kv_heads == MHKV && got.head_dim == HD &&
        got.value_dim == HD);
  EXPECT_OK(cpuattn_context_create(2, &ctx));

  cpuattn_attention_options_init(&causal);
  causal.causal = CPUATTN_CAUSAL_TOP_LEFT;
  EXPECT_OK(cpuattn_mha_forward(mha, &tx, &twant, &causal, ctx));
  CHECK(!all_equal(want, (size_t)MB * T * DM, kSentinel));

  for (growable = 0; growable <= 1; ++growable) {
    cpuattn_kv_cache* cache = NULL;
    const int64_t steps[3] = {3, 1, 2};
    int64_t pos = 0, len = -1;
    int s;
    if (growable) {
      EXPECT_OK(cpuattn_kv_cache_create(MB, MHKV, HD, HD, 1, 1, CPUATTN_DTYPE_F32, &cache));
    } else {
      EXPECT_OK(cpuattn_mha_make_cache(mha, MB, T, 0, CPUATTN_DTYPE_F32, &cache));
    }
    for (s = 0; s < 3; ++s) {
      const int64_t n = steps[s];
      int64_t b;
      /* Tokens [pos, pos + n) of every sequence: strided slices of x and out. */
      cpuattn_tensor xs = tx, os = f32_3d(out, MB, T, DM);
      xs.data = x + pos * DM;
      xs.shape[1] = n;
      os.data = out + pos * DM;
      os.shape[1] = n;
      EXPECT_OK(cpuattn_mha_decode(mha, &xs, cache, &os, NULL, growable ? NULL : ctx));
      for (b = 0; b < MB; ++b) {
        const size_t at = (size_t)(b * T + pos) * DM;
        ++g_checks;
        if (!close_to(out + at, want + at, (size_t)n * DM, kRtol, kAtol, "mha decode")) {
          ++g_failures;
          fprintf(stderr, "FAILED: decode tokens [%d, %d) of batch %d (growable %d)\n", (int)pos,
                  (int)(pos + n), (int)b, growable);
        }
      }
      pos += n;
      EXPECT_OK(cpuattn_kv_cache_length(cache, &len));
      CHECK(len == pos);
    }
    /* The fixed cache is full: one more token fails, changing neither out nor the cache. */
    if (!growable) {
      float one_out[MB * DM];
      cpuattn_tensor xs = tx, os = f32_3d(one_out, MB, 1, DM);
      int i;
      for (i = 0; i < MB * DM; ++i) one_out[i] = kSentinel;
      xs.shape[1] = 1;
      EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                    cpuattn_mha_decode(mha, &xs, cache, &os, NULL, NULL));
      EXPECT_MESSAGE("capacity 6");
      CHECK(all_equal(one_out, MB * DM, kSentinel));
      EXPECT_OK(cpuattn_kv_cache_length(cache, &len));
      CHECK(len == T);
    }
    cpuattn_kv_cache_destroy(cache);
  }

  /* Cross attention of x with itself = bidirectional self-attention. */
  {
    float* self = filled((size_t)MB * T * DM, kSentinel);
    cpuattn_tensor tself = f32_3d(self, MB, T, DM), tout = f32_3d(out, MB, T, DM);
    EXPECT_OK(cpuattn_mha_forward(mha, &tx, &tself, NULL, NULL));
    EXPECT_OK(cpuattn_mha_forward_cross(mha, &tx, &tx, &tout, NULL, ctx));
    ++g_checks;
    if (!close_to(out, self, (size_t)MB * T * DM, kRtol, kAtol, "forward_cross")) {
      ++g_failures;
      fprintf(stderr, "FAILED: forward_cross(x, x) differs from forward(x)\n");
    }
    free(self);
  }

  cpuattn_context_destroy(ctx);
  cpuattn_mha_destroy(mha);
  cpuattn_mha_destroy(NULL);
  mha_fixture_free(&f);
  free(x);
  free(want);
  free(out);
}

/* ------------------------------------------------------------------------------ errors */

/* CPUATTN_ERROR_INVALID_ARGUMENT from the C++ API: the message is cpuattn::Error::what(), as
 * docs/api.md ("Errors") documents it ("cpuattn: K has D=4 but Q has D=8 (Q [...], ...)"), and the
 * output is untouched. */
static void test_invalid_argument(void) {
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* lse = filled(NL, kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D / 2);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_tensor tl = f32_3d(lse, B, H, LQ);
  cpuattn_attention_options opts;
  cpuattn_attention_options_init(&opts);
  opts.lse = &tl;

  /* K's D (4) disagrees with Q's (8). */
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_MESSAGE("K has D=4 but Q has D=8 (Q [2,4,5,8], K [2,2,7,4], V [2,2,7,6], out [2,4,5,6])");
  CHECK(all_equal(out, NO, kSentinel));
  CHECK(all_equal(lse, NL, kSentinel));
  /* The reference validates the same way and says the same. */
  {
    char fast_message[1024];
    strncpy(fast_message, cpuattn_last_error(), sizeof fast_message - 1);
    fast_message[sizeof fast_message - 1] = '\0';
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_reference_attention(&tq, &tk, &tv, &to, &opts));
    CHECK(strcmp(fast_message, cpuattn_last_error()) == 0);
    CHECK(all_equal(out, NO, kSentinel));
  }

  /* Last error: a status-returning success clears it; name-only functions leave it. */
  CHECK(cpuattn_last_error()[0] != '\0');
  (void)cpuattn_status_name(CPUATTN_OK);
  (void)cpuattn_target_name(CPUATTN_TARGET_BEST);
  CHECK(cpuattn_last_error()[0] != '\0');
  {
    cpuattn_target t;
    EXPECT_OK(cpuattn_active_target(NULL, &t));
    CHECK(strcmp(cpuattn_last_error(), "") == 0);
  }

  /* Other checks of the C++ API, each naming its argument. */
  tk = f32_4d(k, B, HKV, LK, D);
  to.strides[3] = 2; /* out's last dimension not contiguous */
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, NULL, NULL));
  EXPECT_MESSAGE("out [2,4,5,6]: the last dimension must be contiguous");
  to = f32_4d(out, B, H, LQ, DV);
  tq.data = NULL; /* a descriptor with NULL data: the C++ check, not a NULL argument */
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, NULL, NULL));
  EXPECT_MESSAGE("Q [2,4,5,8]: data is null");
  tq.data = q;
  opts.lse = NULL;
  opts.has_scale = 1;
  opts.scale = -1.0;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_MESSAGE("scale");
  CHECK(all_equal(out, NO, kSentinel));

  /* Checks of the C layer: enums a C caller may set to anything. */
  cpuattn_attention_options_init(&opts);
  opts.causal = (cpuattn_causal)7;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_MESSAGE("options->causal 7");
  tv.dtype = (cpuattn_dtype)-5;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, NULL, NULL));
  EXPECT_MESSAGE("v.dtype -5");
  tv.dtype = CPUATTN_DTYPE_F32;
  CHECK(all_equal(out, NO, kSentinel));

  /* An absurd KV cache: the C++ API rejects 2^50 tokens as too large (cpuattn::Error), before
   * allocating; *out is untouched. */
  {
    cpuattn_kv_cache* cache = (cpuattn_kv_cache*)&tq; /* a sentinel address */
    EXPECT_STATUS(
        CPUATTN_ERROR_INVALID_ARGUMENT,
        cpuattn_kv_cache_create(1, 8, 128, 128, (int64_t)1 << 50, 0, CPUATTN_DTYPE_F32, &cache));
    EXPECT_MESSAGE("KvCache: too large");
    CHECK(cache == (cpuattn_kv_cache*)&tq);
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_kv_cache_create(1, 1, 1, 1, 0, 0, CPUATTN_DTYPE_F32, &cache));
    EXPECT_MESSAGE("every size must be >= 1");
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_kv_cache_create(1, 1, 1, 1, 4, 0, CPUATTN_DTYPE_BOOL, &cache));
    EXPECT_MESSAGE("not a cache dtype");
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_kv_cache_create(1, 1, 1, 1, 4, 0, (cpuattn_dtype)1000, &cache));
    EXPECT_MESSAGE("dtype 1000");
    CHECK(cache == (cpuattn_kv_cache*)&tq);
  }

  /* MHA: heads not dividing d_model. */
  {
    mha_fixture f;
    cpuattn_mha* mha = (cpuattn_mha*)&tq;
    mha_fixture_init(&f);
    f.config.heads = 3;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_create(&f.config, &f.weights, &mha));
    CHECK(starts_with(cpuattn_last_error(), "cpuattn: "));
    CHECK(mha == (cpuattn_mha*)&tq);
    mha_fixture_free(&f);
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(lse);
}

static void test_null_pointers(void) {
  float q[B * H * LQ * D] = {0}, out[NO];
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_context* ctx = (cpuattn_context*)&tq;
  cpuattn_kv_cache* cache = NULL;
  int64_t n = 0;
  size_t i;
  for (i = 0; i < NO; ++i) out[i] = kSentinel;

  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_attention(NULL, &tq, &tq, &to, NULL, NULL));
  EXPECT_MESSAGE("cpuattn: q is NULL");
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_attention(&tq, NULL, &tq, &to, NULL, NULL));
  EXPECT_MESSAGE("cpuattn: k is NULL");
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_reference_attention(&tq, &tq, &tq, NULL, NULL));
  EXPECT_MESSAGE("cpuattn: out is NULL");
  CHECK(all_equal(out, NO, kSentinel));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_context_create(1, NULL));
  EXPECT_MESSAGE("out is NULL");
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_context_max_target(NULL, NULL));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_active_target(NULL, NULL));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_supported_targets(NULL));
  CHECK(ctx == (cpuattn_context*)&tq);
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_length(NULL, &n));
  EXPECT_MESSAGE("cache is NULL");
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_append(NULL, &tq, &tq));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_clear(NULL));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_truncate(NULL, 0));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_keys(NULL, &tq));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                cpuattn_kv_cache_create(1, 1, 1, 1, 1, 0, CPUATTN_DTYPE_F32, NULL));
  EXPECT_OK(cpuattn_kv_cache_create(1, 1, 4, 4, 2, 0, CPUATTN_DTYPE_F32, &cache));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_length(cache, NULL));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_append(cache, &tq, NULL));
  EXPECT_MESSAGE("cpuattn: v is NULL");
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_kv_cache_values(cache, NULL));

  {
    mha_fixture f;
    cpuattn_mha* mha = (cpuattn_mha*)&tq;
    mha_fixture_init(&f);
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_create(NULL, &f.weights, &mha));
    EXPECT_MESSAGE("config is NULL");
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_create(&f.config, NULL, &mha));
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_create(&f.config, &f.weights, NULL));
    f.weights.wv = NULL;
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_create(&f.config, &f.weights, &mha));
    EXPECT_MESSAGE("cpuattn: weights->wv is NULL");
    CHECK(mha == (cpuattn_mha*)&tq);
    f.weights.wv = &f.twv;
    EXPECT_OK(cpuattn_mha_create(&f.config, &f.weights, &mha));
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_decode(mha, &tq, NULL, &to, NULL, NULL));
    EXPECT_MESSAGE("cache is NULL");
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_forward(NULL, &tq, &to, NULL, NULL));
    EXPECT_MESSAGE("mha is NULL");
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                  cpuattn_mha_make_cache(mha, 1, 1, 0, CPUATTN_DTYPE_F32, NULL));
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_mha_get_config(mha, NULL));
    cpuattn_mha_destroy(mha);
    mha_fixture_free(&f);
  }
  cpuattn_kv_cache_destroy(cache);
}

/* The struct_size rules of cpuattn_c.h. */
static void test_struct_size(void) {
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* want = filled(NO, -kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_tensor tw = f32_4d(want, B, H, LQ, DV);
  cpuattn_tensor garbage;
  cpuattn_attention_options opts;
  struct {
    cpuattn_attention_options o;
    unsigned char newer_fields[24];
  } newer;
  memset(&garbage, 0, sizeof garbage);
  garbage.dtype = (cpuattn_dtype)99; /* would fail if it were read */
  garbage.rank = 9;

  /* 0 and anything below the minimum: an error naming struct_size; out untouched. */
  cpuattn_attention_options_init(&opts);
  opts.struct_size = 0;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_MESSAGE("options->struct_size is 0");
  opts.struct_size = CPUATTN_ATTENTION_OPTIONS_MIN_SIZE - 1;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_reference_attention(&tq, &tk, &tv, &to, &opts));
  EXPECT_MESSAGE("struct_size");
  opts.struct_size = (size_t)1 << 20; /* uninitialized, most likely */
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_MESSAGE("struct_size");
  CHECK(all_equal(out, NO, kSentinel));

  /* An older caller: only struct_size, has_scale, scale and causal. The fields after them hold
   * garbage that must not be read. */
  cpuattn_attention_options_init(&opts);
  opts.causal = CPUATTN_CAUSAL_TOP_LEFT;
  opts.has_scale = 1;
  opts.scale = 0.25;
  EXPECT_OK(cpuattn_reference_attention(&tq, &tk, &tv, &tw, &opts));
  opts.struct_size = CPUATTN_ATTENTION_OPTIONS_MIN_SIZE;
  opts.mask = &garbage;
  opts.key_lengths = &garbage;
  opts.lse = &garbage;
  opts.weights = &garbage;
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  CHECK(close_to(out, want, NO, kRtol, kAtol, "older options struct"));
  /* A size cutting through key_lengths: mask is read, key_lengths is not. */
  opts.mask = NULL;
  opts.struct_size = offsetof(cpuattn_attention_options, key_lengths) + 1;
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  opts.mask = &garbage;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_MESSAGE("options->mask.dtype 99");

  /* A newer caller: larger struct, unknown fields zero = accepted; nonzero = rejected. */
  memset(&newer, 0, sizeof newer);
  cpuattn_attention_options_init(&newer.o);
  newer.o.struct_size = sizeof newer;
  newer.o.causal = CPUATTN_CAUSAL_TOP_LEFT;
  newer.o.has_scale = 1;
  newer.o.scale = 0.25;
  memset(out, 0, NO * sizeof(float));
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, &newer.o, NULL));
  CHECK(close_to(out, want, NO, kRtol, kAtol, "newer options struct"));
  newer.newer_fields[5] = 1;
  for (size_t i = 0; i < NO; ++i) out[i] = kSentinel;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_attention(&tq, &tk, &tv, &to, &newer.o, NULL));
  EXPECT_MESSAGE("struct_size");
  EXPECT_MESSAGE("is not zero");
  CHECK(all_equal(out, NO, kSentinel));

  /* The MHA structs follow the same rules. */
  {
    mha_fixture f;
    cpuattn_mha* mha = NULL;
    cpuattn_mha_config got;
    mha_fixture_init(&f);
    f.config.struct_size = 0;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_create(&f.config, &f.weights, &mha));
    EXPECT_MESSAGE("config->struct_size is 0");
    f.config.struct_size = sizeof f.config;
    f.weights.struct_size = CPUATTN_MHA_WEIGHTS_MIN_SIZE - 8;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_create(&f.config, &f.weights, &mha));
    EXPECT_MESSAGE("weights->struct_size");
    CHECK(mha == NULL);
    /* An older config without kv_heads etc.: kv_heads = heads (4), not the 2 stored after it. */
    f.weights.struct_size = sizeof f.weights;
    f.weights.wk = &f.twq; /* 4 K/V heads */
    f.weights.wv = &f.twq;
    f.config.struct_size = CPUATTN_MHA_CONFIG_MIN_SIZE;
    EXPECT_OK(cpuattn_mha_create(&f.config, &f.weights, &mha));
    memset(&got, 0, sizeof got);
    got.struct_size = CPUATTN_MHA_CONFIG_MIN_SIZE + sizeof(int64_t); /* up to kv_heads */
    got.head_dim = -7;
    EXPECT_OK(cpuattn_mha_get_config(mha, &got));
    CHECK(got.d_model == DM && got.heads == MH && got.kv_heads == MH);
    CHECK(got.head_dim == -7); /* outside its struct_size: not written */
    got.struct_size = 3;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_mha_get_config(mha, &got));
    EXPECT_MESSAGE("out->struct_size is 3");
    cpuattn_mha_destroy(mha);
    mha_fixture_free(&f);
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(want);
}

/* Sanitizer runtimes make a failed operator new abort the process instead of throwing
 * std::bad_alloc (ASan's allocation-size-too-big / out-of-memory reports), and an address-space
 * limit would starve their shadow memory; the out-of-memory test then only runs without them. */
#if defined(__GNUC__) || defined(__clang__)
extern void __asan_init(void) __attribute__((weak));
extern void __tsan_init(void) __attribute__((weak));
extern void __msan_init(void) __attribute__((weak));
extern void __hwasan_init(void) __attribute__((weak));
static int under_sanitizer(void) {
  return __asan_init != NULL || __tsan_init != NULL || __msan_init != NULL || __hwasan_init != NULL;
}
#else
static int under_sanitizer(void) { return 0; }
#endif

/* CPUATTN_ERROR_OUT_OF_MEMORY: a KV cache of 2^38 tokens (1 TiB of K), below the library's
 * 2^40-element limit, so the C++ API tries to allocate it and gets std::bad_alloc. An address-space
 * limit of 64 GiB makes the allocation fail on any machine, whatever its overcommit policy. */
static void test_out_of_memory(void) {
  struct rlimit saved, limited;
  const rlim_t limit = (rlim_t)64 << 30;
  cpuattn_kv_cache* cache = NULL;
  cpuattn_kv_cache* untouched = (cpuattn_kv_cache*)&saved;
  int64_t n = 0;
  float k[4] = {1, 2, 3, 4}, v[4] = {4, 3, 2, 1};
  cpuattn_tensor tk = f32_4d(k, 1, 1, 4, 1), tv = f32_4d(v, 1, 1, 4, 1);

  if (under_sanitizer()) {
    printf("out-of-memory test skipped: a sanitizer's allocator aborts instead of throwing\n");
    return;
  }
  if (getrlimit(RLIMIT_AS, &saved) != 0) {
    printf("out-of-memory test skipped: getrlimit failed\n");
    return;
  }
  EXPECT_OK(cpuattn_kv_cache_create(1, 1, 1, 1, 4, 1, CPUATTN_DTYPE_F32, &cache));
  EXPECT_OK(cpuattn_kv_cache_append(cache, &tk, &tv));

  limited = saved;
  if (limited.rlim_cur == RLIM_INFINITY || limited.rlim_cur > limit) limited.rlim_cur = limit;
  if (setrlimit(RLIMIT_AS, &limited) != 0) {
    printf("out-of-memory test skipped: setrlimit failed\n");
    cpuattn_kv_cache_destroy(cache);
    return;
  }
  EXPECT_STATUS(
      CPUATTN_ERROR_OUT_OF_MEMORY,
      cpuattn_kv_cache_create(1, 1, 1, 1, (int64_t)1 << 38, 0, CPUATTN_DTYPE_F32, &untouched));
  EXPECT_MESSAGE("out of memory");
  CHECK(untouched == (cpuattn_kv_cache*)&saved);
  /* Growing an existing cache: the same, and the cache keeps its tokens and capacity. */
  EXPECT_STATUS(CPUATTN_ERROR_OUT_OF_MEMORY, cpuattn_kv_cache_reserve(cache, (int64_t)1 << 38));
  EXPECT_MESSAGE("out of memory");
  if (setrlimit(RLIMIT_AS, &saved) != 0) {
    fprintf(stderr, "FAILED: could not restore RLIMIT_AS\n");
    ++g_failures;
  }
  EXPECT_OK(cpuattn_kv_cache_length(cache, &n));
  CHECK(n == 4);
  EXPECT_OK(cpuattn_kv_cache_capacity(cache, &n));
  CHECK(n == 4);
  {
    cpuattn_tensor keys;
    EXPECT_OK(cpuattn_kv_cache_keys(cache, &keys));
    CHECK(((const float*)keys.data)[3] == 4.0f);
  }
  cpuattn_kv_cache_destroy(cache);
}

/* CPUATTN_ERROR_INTERNAL cannot be produced from outside (see the top of this file); what can be
 * checked is that its value and name are stable. */
static void test_internal_status(void) {
  CHECK((int)CPUATTN_ERROR_INTERNAL == 4);
  CHECK((int)CPUATTN_OK == 0 && (int)CPUATTN_ERROR_INVALID_ARGUMENT == 1 &&
        (int)CPUATTN_ERROR_OUT_OF_MEMORY == 2 && (int)CPUATTN_ERROR_NULL_POINTER == 3);
  /* The enums mirror cpuattn::DType, cpuattn::Target and cpuattn::Causal value for value. */
  CHECK(CPUATTN_DTYPE_F32 == 0 && CPUATTN_DTYPE_F64 == 1 && CPUATTN_DTYPE_BF16 == 2 &&
        CPUATTN_DTYPE_F16 == 3 && CPUATTN_DTYPE_BOOL == 4 && CPUATTN_DTYPE_I32 == 5 &&
        CPUATTN_DTYPE_I64 == 6 && CPUATTN_DTYPE_I8 == 7);
  CHECK(strcmp(cpuattn_status_name(CPUATTN_ERROR_INTERNAL), "internal") == 0);
}

/* The variants (C API version 2) against the reference; a version-1-sized struct ignores them;
 * bad values are INVALID_ARGUMENT naming the field. */
static void test_variants(void) {
  cpuattn_attention_options opts;
  float slopes[H] = {0.5f, 0.25f, 0.125f, 0.0625f};
  float sinks[H] = {1.0f, -INFINITY, 0.5f, 2.0f};
  cpuattn_tensor tslopes = tensor(slopes, CPUATTN_DTYPE_F32, 1, H, 0, 0, 0);
  cpuattn_tensor tsinks = tensor(sinks, CPUATTN_DTYPE_F32, 1, H, 0, 0, 0);
  float* q = random_floats(NQ, 1.0f);
  float* k = random_floats(NK, 1.0f);
  float* v = random_floats(NV, 1.0f);
  float* out = filled(NO, kSentinel);
  float* plain = filled(NO, -kSentinel);
  cpuattn_tensor tq = f32_4d(q, B, H, LQ, D), tk = f32_4d(k, B, HKV, LK, D);
  cpuattn_tensor tv = f32_4d(v, B, HKV, LK, DV), to = f32_4d(out, B, H, LQ, DV);
  cpuattn_tensor tp = f32_4d(plain, B, H, LQ, DV);

  cpuattn_attention_options_init(&opts);
  CHECK(opts.has_window == 0 && opts.window_left == -1 && opts.window_right == -1 &&
        opts.softcap == 0.0 && opts.alibi == 0 && opts.alibi_slopes == NULL && opts.sinks == NULL);
  opts.has_window = 1;
  opts.window_left = 2;
  opts.window_right = 0;
  compare_with_reference("window (2, 0) + lse", &opts, NULL, 1);
  opts.softcap = 1.5;
  opts.alibi = 1;
  compare_with_reference("window + softcap + default ALiBi + lse", &opts, NULL, 1);
  opts.alibi = 0;
  opts.alibi_slopes = &tslopes;
  opts.sinks = &tsinks;
  compare_with_reference("window + softcap + given slopes + sinks + lse", &opts, NULL, 1);

  /* Each field is read: alone, it changes the result. */
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &tp, NULL, NULL));
  {
    int field;
    for (field = 0; field < 5; ++field) {
      cpuattn_attention_options one;
      cpuattn_attention_options_init(&one);
      if (field == 0) one.has_window = 1, one.window_left = 1;
      if (field == 1) one.softcap = 0.25;
      if (field == 2) one.alibi = 1;
      if (field == 3) one.alibi_slopes = &tslopes;
      if (field == 4) one.sinks = &tsinks;
      EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, &one, NULL));
      CHECK(memcmp(out, plain, NO * sizeof(float)) != 0);
    }
  }

  /* Version 1's size ends before the variants: they are not read, the call is plain. */
  opts.struct_size = offsetof(cpuattn_attention_options, has_window);
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  EXPECT_OK(cpuattn_attention(&tq, &tk, &tv, &tp, NULL, NULL));
  CHECK(memcmp(out, plain, NO * sizeof(float)) == 0);

  cpuattn_attention_options_init(&opts);
  opts.softcap = -1.0;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  CHECK(contains(cpuattn_last_error(), "softcap"));
  cpuattn_attention_options_init(&opts);
  opts.has_window = 1;
  opts.window_left = -3;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_attention(&tq, &tk, &tv, &to, &opts, NULL));
  CHECK(contains(cpuattn_last_error(), "window_left = -3"));
  free(q);
  free(k);
  free(v);
  free(out);
  free(plain);
}

/* A packed batch of three sequences (one without keys) against the varlen reference. */
static void test_varlen(void) {
  enum { TQ = 9, TK = 11, VH = 2 };
  int32_t cu_q[4] = {0, 4, 5, 9};
  int64_t cu_k[4] = {0, 6, 6, 11};
  int32_t bad[4] = {0, 5, 4, 9};
  float* q = random_floats(TQ * VH * D, 1.0f);
  float* k = random_floats(TK * VH * D, 1.0f);
  float* v = random_floats(TK * VH * DV, 1.0f);
  float* out = filled(TQ * VH * DV, kSentinel);
  float* want = filled(TQ * VH * DV, -kSentinel);
  float* lse = filled(VH * TQ, kSentinel);
  float* want_lse = filled(VH * TQ, -kSentinel);
  cpuattn_tensor tq = f32_3d(q, TQ, VH, D), tk = f32_3d(k, TK, VH, D), tv = f32_3d(v, TK, VH, DV);
  cpuattn_tensor to = f32_3d(out, TQ, VH, DV), tw = f32_3d(want, TQ, VH, DV);
  cpuattn_tensor tl = tensor(lse, CPUATTN_DTYPE_F32, 2, VH, TQ, 0, 0);
  cpuattn_tensor twl = tensor(want_lse, CPUATTN_DTYPE_F32, 2, VH, TQ, 0, 0);
  cpuattn_tensor tcq = tensor(cu_q, CPUATTN_DTYPE_I32, 1, 4, 0, 0, 0);
  cpuattn_tensor tck = tensor(cu_k, CPUATTN_DTYPE_I64, 1, 4, 0, 0, 0);
  cpuattn_tensor tbad = tensor(bad, CPUATTN_DTYPE_I32, 1, 4, 0, 0, 0);
  cpuattn_attention_options opts;
  cpuattn_attention_options_init(&opts);
  opts.causal = CPUATTN_CAUSAL_BOTTOM_RIGHT;
  opts.lse = &tl;
  EXPECT_OK(cpuattn_attention_varlen(&tq, &tk, &tv, &to, &tcq, &tck, &opts, NULL));
  opts.lse = &twl;
  EXPECT_OK(cpuattn_reference_attention_varlen(&tq, &tk, &tv, &tw, &tcq, &tck, &opts));
  ++g_checks;
  if (!close_to(out, want, TQ * VH * DV, kRtol, kAtol, "varlen out") ||
      !close_to(lse, want_lse, VH * TQ, kRtol, kAtol, "varlen lse")) {
    ++g_failures;
    fprintf(stderr, "FAILED: varlen: fast path differs from the reference\n");
  }
  CHECK(out[4 * VH * DV] == 0.0f && isinf(lse[4]) && lse[4] < 0); /* sequence 1 has no keys */
  free(out);
  out = filled(TQ * VH * DV, kSentinel);
  to = f32_3d(out, TQ, VH, DV);
  opts.lse = NULL;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_attention_varlen(&tq, &tk, &tv, &to, &tbad, &tck, &opts, NULL));
  CHECK(contains(cpuattn_last_error(), "cu_seqlens_q[2] = 4"));
  CHECK(all_equal(out, TQ * VH * DV, kSentinel));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                cpuattn_attention_varlen(&tq, &tk, &tv, &to, NULL, &tck, &opts, NULL));
  free(q);
  free(k);
  free(v);
  free(out);
  free(want);
  free(lse);
  free(want_lse);
}

/* ------------------------------------------------------------------------- paged KV caches */

/* Sequences 0 and 1 of 9 and 6 tokens, sequence 2 forked from sequence 0's first 5 tokens plus
 * 2 of its own: cpuattn_attention_paged (causal bottom-right, ALiBi slopes per sequence) against
 * the paged reference and against cpuattn_attention on each sequence's tokens laid out
 * contiguously; then the errors, and int8 pools. */
enum { PH = 4, PHKV = 2, PD = 8, PP = 4, PNP = 16 };

static void test_paged(void) {
  const int64_t lens[3] = {9, 6, 7};
  float* k = random_floats((size_t)3 * PHKV * 9 * PD, 1.0f); /* [seq][Hkv][9][D] */
  float* v = random_floats((size_t)3 * PHKV * 9 * PD, 1.0f);
  float* q = random_floats((size_t)3 * PH * 2 * PD, 1.0f);
  float* slopes = random_floats(3 * PH, 0.25f);
  float* out = filled((size_t)3 * PH * 2 * PD, kSentinel);
  float* want = filled((size_t)3 * PH * 2 * PD, kSentinel);
  cpuattn_paged_kv_cache* cache = NULL;
  cpuattn_paged_kv kv, bad;
  cpuattn_attention_options opts;
  cpuattn_tensor tq = f32_4d(q, 3, PH, 2, PD), to = f32_4d(out, 3, PH, 2, PD);
  cpuattn_tensor tw = f32_4d(want, 3, PH, 2, PD), ts;
  int64_t seq[3], n = 0, b, i;
  int32_t ids[8], table[3 * 3];
  int d;
  for (i = 0; i < 3 * PH; ++i) slopes[i] = 0.05f + (slopes[i] < 0 ? -slopes[i] : slopes[i]);
  /* Sequence 2 starts with sequence 0's first 5 tokens. */
  for (d = 0; d < PHKV; ++d) {
    memcpy(k + ((2 * PHKV + d) * 9) * PD, k + (d * 9) * PD, 5 * PD * sizeof(float));
    memcpy(v + ((2 * PHKV + d) * 9) * PD, v + (d * 9) * PD, 5 * PD * sizeof(float));
  }
  EXPECT_OK(cpuattn_paged_kv_cache_create(PNP, PP, PHKV, PD, PD, CPUATTN_DTYPE_F32, &cache));
  for (b = 0; b < 2; ++b) {
    cpuattn_tensor tk = f32_3d(k + b * PHKV * 9 * PD, PHKV, lens[b], PD);
    cpuattn_tensor tv = f32_3d(v + b * PHKV * 9 * PD, PHKV, lens[b], PD);
    tk.strides[0] = tv.strides[0] = 9 * PD;
    EXPECT_OK(cpuattn_paged_kv_cache_add_sequence(cache, &seq[b]));
    EXPECT_OK(cpuattn_paged_kv_cache_append(cache, seq[b], &tk, &tv));
  }
  EXPECT_OK(cpuattn_paged_kv_cache_fork(cache, seq[0], 5, &seq[2]));
  {
    cpuattn_tensor tk = f32_3d(k + (2 * PHKV * 9 + 5) * PD, PHKV, 2, PD);
    cpuattn_tensor tv = f32_3d(v + (2 * PHKV * 9 + 5) * PD, PHKV, 2, PD);
    tk.strides[0] = tv.strides[0] = 9 * PD;
    EXPECT_OK(cpuattn_paged_kv_cache_append(cache, seq[2], &tk, &tv));
  }
  EXPECT_OK(cpuattn_paged_kv_cache_pages(cache, seq[2], ids, 8, &n));
  CHECK(n == 2);
  {
    int32_t ids0[8];
    int64_t n0 = 0;
    EXPECT_OK(cpuattn_paged_kv_cache_pages(cache, seq[0], ids0, 8, &n0));
    CHECK(n0 == 3 && ids0[0] == ids[0] && ids0[1] != ids[1]); /* shared, then copied on write */
  }
  EXPECT_OK(cpuattn_paged_kv_cache_free_pages(cache, &n));
  CHECK(n == PNP - 3 - 2 - 1);
  EXPECT_OK(cpuattn_paged_kv_cache_length(cache, seq[2], &n));
  CHECK(n == 7);

  cpuattn_paged_kv_init(&kv);
  EXPECT_OK(cpuattn_paged_kv_cache_batch(cache, seq, 3, &kv));
  CHECK(kv.block_table.shape[0] == 3 && kv.k_scales.data == NULL);
  cpuattn_attention_options_init(&opts);
  opts.causal = CPUATTN_CAUSAL_BOTTOM_RIGHT;
  ts = tensor(slopes, CPUATTN_DTYPE_F32, 2, 3, PH, 0, 0);
  opts.alibi_slopes = &ts;
  EXPECT_OK(cpuattn_attention_paged(&tq, &kv, &to, &opts, NULL));
  EXPECT_OK(cpuattn_reference_attention_paged(&tq, &kv, &tw, &opts));
  CHECK(close_to(out, want, (size_t)3 * PH * 2 * PD, kRtol, kAtol, "paged vs paged reference"));
  for (b = 0; b < 3; ++b) {
    /* The same sequence laid out contiguously, [1, Hkv, len, D] with a row stride of 9 tokens. */
    cpuattn_tensor qb = f32_4d(q + b * PH * 2 * PD, 1, PH, 2, PD);
    cpuattn_tensor ob = f32_4d(want + b * PH * 2 * PD, 1, PH, 2, PD);
    cpuattn_tensor kb = f32_4d(k + b * PHKV * 9 * PD, 1, PHKV, lens[b], PD);
    cpuattn_tensor vb = f32_4d(v + b * PHKV * 9 * PD, 1, PHKV, lens[b], PD);
    cpuattn_tensor sb = tensor(slopes + b * PH, CPUATTN_DTYPE_F32, 1, PH, 0, 0, 0);
    cpuattn_attention_options ob_opts = opts;
    kb.strides[1] = vb.strides[1] = 9 * PD;
    ob_opts.alibi_slopes = &sb;
    EXPECT_OK(cpuattn_attention(&qb, &kb, &vb, &ob, &ob_opts, NULL));
  }
  CHECK(close_to(out, want, (size_t)3 * PH * 2 * PD, kRtol, kAtol, "paged vs contiguous"));

  /* A block id outside the pool, struct_size 0, a wrong B: errors that write nothing. */
  memcpy(table, kv.block_table.data, sizeof table);
  table[1 * 3 + 0] = 99;
  bad = kv;
  bad.block_table.data = table;
  for (i = 0; i < 3 * PH * 2 * PD; ++i) out[i] = kSentinel;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_attention_paged(&tq, &bad, &to, &opts, NULL));
  EXPECT_MESSAGE("block_table[1, 0] = 99 is outside [0, num_pages)");
  bad = kv;
  bad.struct_size = 0;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_attention_paged(&tq, &bad, &to, &opts, NULL));
  EXPECT_MESSAGE("kv->struct_size is 0");
  tq.shape[0] = to.shape[0] = ts.shape[0] = 2;
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                cpuattn_attention_paged(&tq, &kv, &to, &opts, NULL));
  EXPECT_MESSAGE("block_table has shape [3,3] but Q has B=2");
  tq.shape[0] = to.shape[0] = ts.shape[0] = 3;
  CHECK(all_equal(out, (size_t)3 * PH * 2 * PD, kSentinel));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_attention_paged(&tq, NULL, &to, &opts, NULL));
  EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER, cpuattn_paged_kv_cache_batch(cache, NULL, 2, &kv));
  /* A failed append (too few free pages) changes nothing. */
  {
    float* big = random_floats((size_t)PHKV * 64 * PD, 1.0f);
    cpuattn_tensor tb = f32_3d(big, PHKV, 64, PD);
    EXPECT_OK(cpuattn_paged_kv_cache_free_pages(cache, &n));
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_paged_kv_cache_append(cache, seq[1], &tb, &tb));
    EXPECT_OK(cpuattn_paged_kv_cache_free_pages(cache, &i));
    CHECK(i == n);
    EXPECT_OK(cpuattn_paged_kv_cache_length(cache, seq[1], &n));
    CHECK(n == 6);
    free(big);
  }
  EXPECT_OK(cpuattn_paged_kv_cache_free_sequence(cache, seq[2]));
  EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT, cpuattn_paged_kv_cache_length(cache, seq[2], &n));
  cpuattn_paged_kv_cache_destroy(cache);

  /* int8 pools: the batch carries the scales; the fast path against the paged reference. */
  EXPECT_OK(cpuattn_paged_kv_cache_create(PNP, PP, PHKV, PD, PD, CPUATTN_DTYPE_I8, &cache));
  EXPECT_OK(cpuattn_paged_kv_cache_add_sequence(cache, &seq[0]));
  {
    cpuattn_tensor tk = f32_3d(k, PHKV, 9, PD), tv = f32_3d(v, PHKV, 9, PD);
    EXPECT_OK(cpuattn_paged_kv_cache_append(cache, seq[0], &tk, &tv));
  }
  cpuattn_paged_kv_init(&kv);
  EXPECT_OK(cpuattn_paged_kv_cache_batch(cache, seq, 1, &kv));
  CHECK(kv.k_scales.data != NULL && kv.k_pages.dtype == CPUATTN_DTYPE_I8);
  tq.shape[0] = 1;
  to.shape[0] = tw.shape[0] = 1;
  opts.alibi_slopes = NULL;
  EXPECT_OK(cpuattn_attention_paged(&tq, &kv, &to, &opts, NULL));
  EXPECT_OK(cpuattn_reference_attention_paged(&tq, &kv, &tw, &opts));
  /* The native VNNI P V rounds the weights to int16: 2^-9 of max |v| (1). */
  CHECK(close_to(out, want, (size_t)PH * 2 * PD, kRtol, 2e-3, "int8 paged vs reference"));
  cpuattn_paged_kv_cache_destroy(cache);
  free(k);
  free(v);
  free(q);
  free(slopes);
  free(out);
  free(want);
}

/* MHA decoding on a paged cache (pages of 2 tokens) gives what it gives on a contiguous cache:
 * 3 + 1 + 2 tokens for both sequences; a step with too few free pages changes nothing. */
static void test_mha_decode_paged(void) {
  mha_fixture f;
  cpuattn_mha* mha = NULL;
  cpuattn_kv_cache* flat = NULL;
  cpuattn_paged_kv_cache* paged = NULL;
  float* x = random_floats((size_t)MB * T * DM, 1.0f);
  float* want = filled((size_t)MB * DM * 3, kSentinel);
  float* out = filled((size_t)MB * DM * 3, kSentinel);
  const int64_t steps[3] = {3, 1, 2};
  int64_t seqs[MB], pos = 0, n = 0;
  int s, b;
  mha_fixture_init(&f);
  EXPECT_OK(cpuattn_mha_create(&f.config, &f.weights, &mha));
  EXPECT_OK(cpuattn_mha_make_cache(mha, MB, T, 0, CPUATTN_DTYPE_F32, &flat));
  EXPECT_OK(cpuattn_paged_kv_cache_create(7, 2, MHKV, HD, HD, CPUATTN_DTYPE_F32, &paged));
  for (b = 0; b < MB; ++b) EXPECT_OK(cpuattn_paged_kv_cache_add_sequence(paged, &seqs[b]));
  for (s = 0; s < 3; ++s) {
    cpuattn_tensor xs = f32_3d(x + pos * DM, MB, steps[s], DM);
    cpuattn_tensor tw = f32_3d(want, MB, steps[s], DM), to = f32_3d(out, MB, steps[s], DM);
    xs.strides[0] = T * DM;
    EXPECT_OK(cpuattn_mha_decode(mha, &xs, flat, &tw, NULL, NULL));
    EXPECT_OK(cpuattn_mha_decode_paged(mha, &xs, paged, seqs, MB, &to, NULL, NULL));
    CHECK(close_to(out, want, (size_t)MB * steps[s] * DM, kRtol, kAtol, "paged mha decode"));
    pos += steps[s];
  }
  /* 6 tokens of 2 sequences hold 6 of the 7 pages: 2 more tokens each need 2 pages. */
  {
    cpuattn_tensor xs = f32_3d(x, MB, 2, DM), to = f32_3d(out, MB, 2, DM);
    xs.strides[0] = T * DM;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_mha_decode_paged(mha, &xs, paged, seqs, MB, &to, NULL, NULL));
    EXPECT_OK(cpuattn_paged_kv_cache_length(paged, seqs[0], &n));
    CHECK(n == 6);
    EXPECT_OK(cpuattn_paged_kv_cache_free_pages(paged, &n));
    CHECK(n == 1);
    EXPECT_STATUS(CPUATTN_ERROR_NULL_POINTER,
                  cpuattn_mha_decode_paged(mha, &xs, paged, NULL, MB, &to, NULL, NULL));
  }
  cpuattn_paged_kv_cache_destroy(paged);
  cpuattn_kv_cache_destroy(flat);
  cpuattn_mha_destroy(mha);
  mha_fixture_free(&f);
  free(x);
  free(want);
  free(out);
}

/* Issue 33: appending a cache's own views to it (item 1), and cu_seqlens descriptors with a huge
 * shape, a huge stride or a misaligned pointer (item 9): the first works, the others are
 * CPUATTN_ERROR_INVALID_ARGUMENT with nothing written. */
static void test_hostile(void) {
  cpuattn_kv_cache* c = NULL;
  cpuattn_tensor t, ck, cv;
  int64_t s[4] = {1, 1, 2, 4}, len = 0, i;
  float kv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const float* keys;
  EXPECT_OK(cpuattn_kv_cache_create(1, 1, 4, 4, 2, 1, CPUATTN_DTYPE_F32, &c));
  EXPECT_OK(cpuattn_tensor_contiguous(&t, kv, CPUATTN_DTYPE_F32, 4, s));
  EXPECT_OK(cpuattn_kv_cache_append(c, &t, &t));
  EXPECT_OK(cpuattn_kv_cache_keys(c, &ck));
  EXPECT_OK(cpuattn_kv_cache_values(c, &cv));
  EXPECT_OK(cpuattn_kv_cache_append(c, &ck, &cv)); /* full: grows, reading its own old tokens */
  EXPECT_OK(cpuattn_kv_cache_length(c, &len));
  CHECK(len == 4);
  EXPECT_OK(cpuattn_kv_cache_keys(c, &ck));
  keys = (const float*)ck.data;
  for (i = 0; i < 8; ++i) CHECK(keys[i] == kv[i] && keys[8 + i] == kv[i]);
  cpuattn_kv_cache_destroy(c);
  {
    float* q = random_floats(7 * 2 * 8, 1.0f);
    float* out = filled(7 * 2 * 8, kSentinel);
    int64_t cu[4] = {0, 3, 7, 7};
    cpuattn_tensor tq = f32_3d(q, 7, 2, 8), to = f32_3d(out, 7, 2, 8), tcu;
    const int64_t huge_shape = (int64_t)1 << 61;
    EXPECT_OK(cpuattn_tensor_contiguous(&tcu, cu, CPUATTN_DTYPE_I64, 1, &huge_shape));
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_attention_varlen(&tq, &tq, &tq, &to, &tcu, &tcu, NULL, NULL));
    EXPECT_MESSAGE("cu_seqlens_q");
    tcu.shape[0] = 3;
    tcu.strides[0] = (int64_t)1 << 62;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_attention_varlen(&tq, &tq, &tq, &to, &tcu, &tcu, NULL, NULL));
    EXPECT_MESSAGE("overflow");
    tcu.strides[0] = 1;
    tcu.data = (char*)cu + 1;
    EXPECT_STATUS(CPUATTN_ERROR_INVALID_ARGUMENT,
                  cpuattn_attention_varlen(&tq, &tq, &tq, &to, &tcu, &tcu, NULL, NULL));
    EXPECT_MESSAGE("not aligned");
    CHECK(all_equal(out, 7 * 2 * 8, kSentinel));
    free(q);
    free(out);
  }
}

int main(void) {
  test_version_and_names();
  test_tensor_helpers();
  test_attention_matches_reference();
  test_weights_output();
  test_contexts();
  test_kv_cache_and_attention();
  test_scaled_caches();
  test_mha_decode_matches_forward();
  test_mha_rope_and_qk_norm();
  test_invalid_argument();
  test_null_pointers();
  test_struct_size();
  test_variants();
  test_varlen();
  test_paged();
  test_mha_decode_paged();
  test_hostile();
  test_internal_status();
  test_out_of_memory(); /* last: it briefly limits the address space */
  if (g_failures) {
    fprintf(stderr, "test_c_api: %d of %d checks FAILED\n", g_failures, g_checks);
    return 1;
  }
  printf("test_c_api: all %d checks passed\n", g_checks);
  return 0;
}
