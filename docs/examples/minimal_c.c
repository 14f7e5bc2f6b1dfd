/* Linking cpuattn into a C program: causal self-attention through the C API (cpuattn_c.h).
 * Prints the first output value; exits 0 on success, 1 (with the library's message) on error. */
#include <cpuattn/cpuattn_c.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  enum { B = 2, H = 8, L = 128, D = 64 };
  const size_t n = (size_t)B * H * L * D;
  float* q = (float*)malloc(n * sizeof(float));
  float* k = (float*)malloc(n * sizeof(float));
  float* v = (float*)malloc(n * sizeof(float));
  float* out = (float*)malloc(n * sizeof(float));
  cpuattn_tensor tq, tk, tv, tout;
  cpuattn_attention_options opts;
  cpuattn_context* ctx = NULL;
  cpuattn_status st;
  size_t i;
  if (!q || !k || !v || !out) return 1;
  for (i = 0; i < n; ++i) {
    q[i] = 0.01f * (float)(i % 7);
    k[i] = 0.02f * (float)(i % 5);
    v[i] = 0.5f + 0.001f * (float)(i % 11);
  }
  /* Logical [B, H, L, D] views of [B, L, H, D] memory (a projection's output): strides only. */
  cpuattn_tensor_blhd(&tq, q, CPUATTN_DTYPE_F32, B, L, H, D);
  cpuattn_tensor_blhd(&tk, k, CPUATTN_DTYPE_F32, B, L, H, D);
  cpuattn_tensor_blhd(&tv, v, CPUATTN_DTYPE_F32, B, L, H, D);
  cpuattn_tensor_blhd(&tout, out, CPUATTN_DTYPE_F32, B, L, H, D);

  cpuattn_attention_options_init(&opts); /* sets struct_size */
  opts.causal = CPUATTN_CAUSAL_TOP_LEFT;
  st = cpuattn_context_create(2, &ctx); /* two threads; NULL would mean the default context */
  if (st == CPUATTN_OK) st = cpuattn_attention(&tq, &tk, &tv, &tout, &opts, ctx);
  if (st != CPUATTN_OK) {
    fprintf(stderr, "%s: %s\n", cpuattn_status_name(st), cpuattn_last_error());
  } else {
    printf("cpuattn %s: out[0] = %g\n", cpuattn_version_string(), (double)out[0]);
  }
  cpuattn_context_destroy(ctx);
  free(q);
  free(k);
  free(v);
  free(out);
  return st == CPUATTN_OK ? 0 : 1;
}
