// Entry points to single micro-kernels of every provider and target, for tests/kernels/: the
// per-target units (micro_hwy.cc, micro_xsimd.cc) instantiate the library's kernel pieces
// (lib/kernels/, lib/simd/) with their provider, exactly as the library's own units do, and
// export them through the same dispatch mechanism. Test assertions stay in the target-independent
// driver (test_kernels.cpp), so no test framework code is compiled with AVX-512 flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.h"
#include "cpuattn/cpuattn.h"
#include "dispatch/dispatch.h"
#include "kernels/flash/config.h"

namespace cpuattn::detail {

struct MicroKernels {
  Target target;
  Simd provider;
  int lanes, score_rows, score_cols, pv_rows, pv_cols;
  std::int64_t block_keys;
  void (*exp2)(const float* in, float* out, std::size_t n);
  void (*exp2_bf16)(const float* in, float* out, std::size_t n);  // Exp2Bf16
  void (*tanh)(const float* in, float* out, std::size_t n);
  void (*softcap)(const float* in, float* out, std::size_t n, float cap);
  // Transposes a lanes x lanes row-major matrix in place, through registers.
  void (*transpose)(float* m);
  // The score micro-kernel for R rows and one panel of score_cols * lanes keys (s aligned).
  // masked: apply ends[r] and masks[r] (nullptr or the row's mask at the tile's first key).
  // ProbBlockTiles: rows of Qp (stride qs) against ncols keys of packed K panels ([panel][D][W]),
  // s[r][j] = 2^(q_r . k_j - m[r]), lsum[r * lanes, + lanes) their lanes' partial sums; false if
  // a score is above m[r] + 8. With `first`, m[r] is set to row r's largest score of the first
  // panel (and back to -inf on false).
  bool (*prob_block)(int rows, const float* q, std::int64_t qs, std::int64_t D, const float* kp,
                     std::int64_t ncols, float* m, bool first, float* s, std::int64_t s_stride,
                     float* lsum);
  void (*score_tile)(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp,
                     float* s, std::int64_t s_stride, std::int32_t col0, bool masked,
                     const std::int32_t* ends, const void* const* masks, MaskKind kind,
                     std::int64_t mask_stride);
  // acc[R][C vectors] += P[R][nk] . Vp chunk (vp rows cw floats apart). acc aligned. With
  // out_rows (PvOut, pv-inl.h), row r of the result times scale[r] also goes to out_rows[r][0,
  // C vectors), non-temporal where `stream` and the row is aligned (fenced before returning).
  void (*pv_tile)(int R, int C, const float* p, std::int64_t p_stride, const float* vp,
                  std::int64_t cw, std::int64_t nk, float* acc, std::int64_t acc_stride,
                  float* const* out_rows, const float* scale, bool stream);
  // Packs keys [j0, j0 + nk) of (b, hk) into Kp panels, times kscale, and Vp chunks (see
  // kernels/flash/kv_pack-inl.h).
  void (*pack_kv)(const Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0,
                  std::int64_t nk, float kscale, float* kp, float* vp);
  // One online-softmax step of a row (flash softmax-inl.h); lrow holds lanes partial sums.
  void (*softmax_row)(float* srow, std::int64_t ncols, float* m, float* lrow, float* arow,
                      std::int64_t dvp);
  // n elements of a K/V dtype widened to f32 (kv/<type>.h LoadWide: whole vectors, then
  // LoadWidePartial for the tail).
  void (*widen)(DType dtype, const void* in, float* out, std::size_t n);
  // n fp8_e4m3 bytes read as Fp8E4M3Lo, the decode units' reading at 2^-120 of the value
  // (kv/fp8_e4m3.h: LoadWideN's pairs, then single vectors; n a whole number of vectors).
  void (*widen_fp8_lo)(const std::uint8_t* in, float* out, std::size_t n);
  // n bf16 (a whole number of 2 x lanes) read by parity (kv/bf16.h LoadWideEven / LoadWideOdd,
  // the GEMV's reading) and put back in element order; false on targets without those loads.
  bool (*widen_bf16_parity)(const std::uint16_t* in, float* out, std::size_t n);
  // QUnit::f32 (q_pack-inl.h): rows of a query block into Qp, scaled, row stride qs.
  void (*pack_q)(const Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
                 std::int64_t pos0, int rows, float qscale, std::int64_t qs, float* qp);
  // KeysAsRows (kernels/flash/keys_rows-inl.h) on one key block: nk rows of K or V (ks or vs
  // floats apart) against lanes of query rows, qp lanes per row of Qt [D][qp], St [nk][qp] and
  // Acct [Dv][qp] (qp a whole number of kr_chunk lanes; all three aligned).
  int kr_chunk;
  // ScoreBlock: st[j][i] = k_j . qt[., i]; mnew[i] = the largest of m[i] and st[., i].
  void (*kr_score_block)(const float* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                         const float* qt, int qp, const float* m, float* st, float* mnew);
  // ProbBlock: st[j][i] = 2^(k_j . qt[., i] - m[i]), sums[i] their sum over j; false if a score
  // is above m[i] + 8.
  bool (*kr_prob_block)(const float* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                        const float* qt, int qp, const float* m, float* st, float* sums);
  // PvBlock: acct[c][i] += sum over j of v_j[c] st[j][i], for c < Dv.
  void (*kr_pv_block)(const float* v, std::int64_t vs, std::int64_t Dv, std::int64_t nk,
                      const float* st, int qp, float* acct);
  // ScoreUnit::dot (stream_dot-inl.h, DotScores): s[r][j] = qp[r] . K[j] (times kscale[j * kss]
  // when kscale is not null), K rows of `kdt` ks elements apart.
  void (*stream_dot)(DType kdt, int R, const float* qp, std::int64_t qs, std::int64_t D,
                     const void* k, std::int64_t ks, std::int64_t nk, const float* kscale,
                     std::int64_t kss, float* s, std::int64_t s_stride);
  // ScoreUnit::dot_runs (stream_runs-inl.h, DotScoresRuns): run i has n[i] keys from k[i], with
  // scales from kscale[i] (or none), scores at s + off[i].
  void (*stream_runs)(DType kdt, int R, const float* qp, std::int64_t qs, std::int64_t D, int nruns,
                      const void* const* k, const float* const* kscale, const std::int64_t* off,
                      const std::int64_t* n, std::int64_t ks, std::int64_t kss, float* s,
                      std::int64_t s_stride);
  // PvUnit::runs (pv-inl.h, PvRows over VRuns): acc[R][C vectors] += p[R][keys of the runs] .
  // V[key][c0 ..], run i's n[i] rows from v[i] (v_stride elements apart) holding keys j0[i]...
  void (*pv_runs)(DType vdt, int R, int C, const float* p, std::int64_t p_stride, int nruns,
                  const void* const* v, const std::int64_t* j0, const std::int64_t* n,
                  std::int64_t c0, std::int64_t v_stride, float* acc, std::int64_t acc_stride);
  // The output epilogue (epilogue-inl.h, WriteRow) of row (b, h, i) from state (m, l, sink).
  void (*write_row)(const Problem& p, OutUnit unit, float m, float l, float sink, const float* arow,
                    std::int64_t b, std::int64_t h, std::int64_t i);
  // Whether acc[0, n) is all finite (pv_skip_zero-inl.h, AccFinite; n whole vectors, acc
  // aligned).
  bool (*acc_finite)(const float* acc, std::int64_t n);
  // The split-key merge (merge-inl.h, MergeRows) of rows [row0, row1); buf holds Dv floats.
  void (*merge_rows)(const Problem& p, const Plan& pl, std::int64_t row0, std::int64_t row1,
                     float* buf);
};

const MicroKernels& micro_kernels(const Choice& choice);

}  // namespace cpuattn::detail

CPUATTN_DECLARE_UNIT_TABLES(MicroKernels, GetMicroKernels)
