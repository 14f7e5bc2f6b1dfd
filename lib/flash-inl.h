// The fused flash-attention kernel, written once against a small set of vector operations.
//
// The includer opens the namespace and defines `Ops`, a struct of static vector operations
// (see hwy_ops-inl.h); this file adds the templates that tile, mask, run the online softmax and
// accumulate P V. It includes nothing itself. Per-target include guard, as Highway's -inl.h
// convention requires: the body is compiled once per target inside that target's namespace.
//
// Layout of one task's work (all f32):
//   Qp  [rows][DP]          query rows of one block, DP = D rounded up to a vector, pre-multiplied
//                           by scale * log2(e) so that the softmax runs in base 2 (exp2 is
//                           cheaper than exp).
//   Kp  [panels][D][W]      a K block transposed into panels of W = kScoreCols vectors of
//                           keys, so the score micro-kernel streams W contiguous keys per d.
//   Vp  [chunks][nk][CW]    a V block split into column chunks of CW = kPvCols vectors, so the
//                           P V micro-kernel streams one contiguous chunk per key.
//   S   [rows][Nk]          the scores of one (Q block, K block) pair, then the probabilities.
//   Acc [rows][DvP]         the unnormalized output, DvP = Dv rounded up to a vector.
#if defined(CPUATTN_FLASH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_FLASH_INL_H_
#undef CPUATTN_FLASH_INL_H_
#else
#define CPUATTN_FLASH_INL_H_
#endif

// Masking of one score row inside the score micro-kernel's epilogue, while the scores are still in
// registers. `end` is the first key (relative to the tile) this row may not see; `mask` points at
// the row's mask entries for the tile's first key (nullptr: no mask tensor).
struct RowMask {
  std::int32_t end;
  const void* mask;
};

struct MaskInfo {
  detail::MaskKind kind;
  std::int64_t stride;  // element stride of the mask along keys (0 = broadcast)
};

// Only lanes below rm.end are read from the mask: past it lies the end of the mask row (or of
// the tensor), and those lanes become -inf anyway.
template <class O>
HWY_INLINE typename O::V ApplyRowMask(typename O::V s, std::int32_t col0, const RowMask& rm,
                                      const MaskInfo& mi) {
  constexpr int N = O::kLanes;
  if (rm.mask != nullptr && col0 < rm.end) {
    const bool full = mi.stride == 1 && col0 + N <= rm.end;
    const int valid = std::min(N, rm.end - col0);
    if (mi.kind == detail::MaskKind::additive) {
      const float* m = static_cast<const float*>(rm.mask) + col0 * mi.stride;
      typename O::V add;
      if (full) {
        add = O::LoadU(m);
      } else {
        alignas(64) float tmp[N] = {};
        for (int i = 0; i < valid; ++i) tmp[i] = m[i * mi.stride];
        add = O::Load(tmp);
      }
      s = O::MulAdd(add, O::Set(1.4426950408889634f), s);
    } else {
      const std::uint8_t* m = static_cast<const std::uint8_t*>(rm.mask) + col0 * mi.stride;
      if (full) {
        s = O::KeepIfByteSet(s, m);
      } else {
        alignas(64) std::uint8_t tmp[N] = {};
        for (int i = 0; i < valid; ++i) tmp[i] = m[i * mi.stride];
        s = O::KeepIfByteSet(s, tmp);
      }
    }
  }
  return O::KeepBelow(s, col0, rm.end);
}

// Scores of R rows x W = C vectors of keys (C = O::kScoreCols): S[r][0:W] = Qp[r] . Kp panel.
// R * C accumulators stay in registers for the whole D loop; each d costs C loads, R broadcasts
// and R * C FMAs.
template <class O, int R, bool kMasked>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT q, std::int64_t qs, std::int64_t D,
                          const float* HWY_RESTRICT kp, float* HWY_RESTRICT s,
                          std::int64_t s_stride, std::int32_t col0, const RowMask* rows,
                          const MaskInfo& mi) {
  using V = typename O::V;
  constexpr int N = O::kLanes, C = O::kScoreCols;
  V acc[R][C];
  HWY_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int c = 0; c < C; ++c) acc[r][c] = O::Zero();
  }
  AccumulateOuter<O, R, C>(q, 1, qs, kp, C * N, D, acc);
  HWY_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int c = 0; c < C; ++c) {
      if constexpr (kMasked) acc[r][c] = ApplyRowMask<O>(acc[r][c], col0 + c * N, rows[r], mi);
      O::Store(acc[r][c], s + r * s_stride + c * N);
    }
  }
}

template <class O, bool kMasked>
void ScoreRows(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp, float* s,
               std::int64_t s_stride, std::int32_t col0, const RowMask* rows, const MaskInfo& mi) {
  static_assert(O::kScoreRows <= 12, "extend the switch below");
  switch (R) {
#define CPUATTN_SCORE_CASE(n)                                              \
  case n:                                                                  \
    if constexpr (n <= O::kScoreRows)                                      \
      ScoreTile<O, n, kMasked>(q, qs, D, kp, s, s_stride, col0, rows, mi); \
    break;
    CPUATTN_SCORE_CASE(1)
    CPUATTN_SCORE_CASE(2)
    CPUATTN_SCORE_CASE(3)
    CPUATTN_SCORE_CASE(4)
    CPUATTN_SCORE_CASE(5)
    CPUATTN_SCORE_CASE(6)
    CPUATTN_SCORE_CASE(7)
    CPUATTN_SCORE_CASE(8)
    CPUATTN_SCORE_CASE(9)
    CPUATTN_SCORE_CASE(10)
    CPUATTN_SCORE_CASE(11)
    CPUATTN_SCORE_CASE(12)
#undef CPUATTN_SCORE_CASE
    default:
      break;
  }
}

// Acc[R][0:C vectors] += P[R][0:nk] . Vp chunk [nk][CW]. R * C accumulators in registers; each key
// costs C loads, R broadcasts and R*C FMAs.
template <class O, int R, int C>
HWY_INLINE void PvTile(const float* HWY_RESTRICT p, std::int64_t p_stride,
                       const float* HWY_RESTRICT vp, std::int64_t cw, std::int64_t nk,
                       float* HWY_RESTRICT acc_out, std::int64_t acc_stride) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  V acc[R][C];
  HWY_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(16)
    for (int c = 0; c < C; ++c) acc[r][c] = O::Load(acc_out + r * acc_stride + c * N);
  }
  AccumulateOuter<O, R, C>(p, 1, p_stride, vp, cw, nk, acc);
  HWY_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(16)
    for (int c = 0; c < C; ++c) O::Store(acc[r][c], acc_out + r * acc_stride + c * N);
  }
}

template <class O, int C>
void PvRowsC(int R, const float* p, std::int64_t p_stride, const float* vp, std::int64_t cw,
             std::int64_t nk, float* acc, std::int64_t acc_stride) {
  switch (R) {
#define CPUATTN_PV_CASE(n)                                                                    \
  case n:                                                                                     \
    if constexpr (n <= O::kPvRows) PvTile<O, n, C>(p, p_stride, vp, cw, nk, acc, acc_stride); \
    break;
    CPUATTN_PV_CASE(1)
    CPUATTN_PV_CASE(2)
    CPUATTN_PV_CASE(3)
    CPUATTN_PV_CASE(4)
    CPUATTN_PV_CASE(5)
    CPUATTN_PV_CASE(6)
    CPUATTN_PV_CASE(7)
    CPUATTN_PV_CASE(8)
#undef CPUATTN_PV_CASE
    default:
      break;
  }
}

template <class O>
void PvRows(int R, int C, const float* p, std::int64_t p_stride, const float* vp, std::int64_t cw,
            std::int64_t nk, float* acc, std::int64_t acc_stride) {
  static_assert(O::kPvRows <= 8 && O::kPvCols <= 4, "extend the switches");
  switch (C) {
    case 1:
      PvRowsC<O, 1>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    case 2:
      if constexpr (O::kPvCols >= 2) PvRowsC<O, 2>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    case 3:
      if constexpr (O::kPvCols >= 3) PvRowsC<O, 3>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    case 4:
      if constexpr (O::kPvCols >= 4) PvRowsC<O, 4>(R, p, p_stride, vp, cw, nk, acc, acc_stride);
      break;
    default:
      break;
  }
}

// Geometry shared by packing and compute, derived from the problem and the target.
template <class O>
struct Geometry {
  static constexpr int N = O::kLanes;
  static constexpr int W = O::kScoreCols * N;  // keys per score panel
  static constexpr int CW = O::kPvCols * N;    // values per P V chunk
  std::int64_t D, Dv, DvP, Nk;
  std::int64_t k_block_floats() const { return Nk * D; }    // Kp of one block
  std::int64_t v_block_floats() const { return Nk * DvP; }  // Vp of one block
  std::int64_t kv_block_floats() const { return k_block_floats() + v_block_floats(); }
  explicit Geometry(const detail::Problem& p, std::int64_t block_keys)
      : D(p.D), Dv(p.Dv), DvP((p.Dv + N - 1) / N * N), Nk(block_keys) {}
};

// Prefetches (into L2) the K and V rows of keys [j0, j0 + nk) of one K/V head.
inline void PrefetchKV(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0,
                       std::int64_t nk) {
  const char* K = static_cast<const char*>(p.k.data) + (b * p.k.s[0] + hk * p.k.s[1]) * 4;
  const char* V = static_cast<const char*>(p.v.data) + (b * p.v.s[0] + hk * p.v.s[1]) * 4;
  for (std::int64_t j = j0; j < j0 + nk; ++j) {
    for (std::int64_t off = 0; off < p.D * 4; off += 64)
      __builtin_prefetch(K + j * p.k.s[2] * 4 + off, 0, 2);
    for (std::int64_t off = 0; off < p.Dv * 4; off += 64)
      __builtin_prefetch(V + j * p.v.s[2] * 4 + off, 0, 2);
  }
}

// Packs the V rows of keys [j0, j0 + nk) into column chunks of CW values, zero-padded.
template <class O>
void PackV(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
           std::int64_t j0, std::int64_t nk, float* HWY_RESTRICT vp) {
  constexpr int N = O::kLanes;
  constexpr int CW = Geometry<O>::CW;
  const float* Vs = static_cast<const float*>(p.v.data) + b * p.v.s[0] + hk * p.v.s[1];
  for (std::int64_t c0 = 0; c0 < g.DvP; c0 += CW) {
    const std::int64_t cw = std::min<std::int64_t>(CW, g.DvP - c0);
    float* dst = vp + c0 * nk;  // chunk c0 holds nk rows of cw values
    const std::int64_t valid = std::max<std::int64_t>(0, std::min(cw, g.Dv - c0));
    for (std::int64_t k = 0; k < nk; ++k) {
      const float* src = Vs + (j0 + k) * p.v.s[2] + c0;
      float* row = dst + k * cw;
      std::int64_t c = 0;
      for (; c + N <= valid; c += N) O::Store(O::LoadU(src + c), row + c);
      for (; c < valid; ++c) row[c] = src[c];
      for (; c < cw; ++c) row[c] = 0.0f;
    }
  }
}

// Packs keys [j0, j0 + nk) of one K/V head into Kp panels and Vp chunks (zero-padded).
template <class O>
void PackKV(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
            std::int64_t j0, std::int64_t nk, float* HWY_RESTRICT kp, float* HWY_RESTRICT vp) {
  constexpr int W = Geometry<O>::W;
  const float* K = static_cast<const float*>(p.k.data) + b * p.k.s[0] + hk * p.k.s[1];
  constexpr int N = O::kLanes;
  const std::int64_t panels = (nk + W - 1) / W;
  // K: N x N squares (N keys x N dims) transposed in registers; missing keys are zero rows and
  // dims past D are never stored.
  for (std::int64_t pi = 0; pi < panels; ++pi) {
    float* dst = kp + pi * g.D * W;
    for (int part = 0; part < O::kScoreCols; ++part) {
      const std::int64_t w0 = pi * W + part * N;  // first key of this square, within the block
      const std::int64_t keys = std::clamp<std::int64_t>(nk - w0, 0, N);
      for (std::int64_t d0 = 0; d0 < g.D; d0 += N) {
        const std::int64_t dims = std::min<std::int64_t>(N, g.D - d0);
        typename O::V r[N];
        for (int w = 0; w < N; ++w) {
          if (w >= keys) {
            // A padding key: no address is formed for it (with a huge key stride, legal when
            // Lk = 1, K + key * stride overflowed the pointer; found by fuzz_validate).
            r[w] = O::Zero();
            continue;
          }
          const float* src = K + (j0 + w0 + w) * p.k.s[2] + d0;
          if (dims == N) {
            r[w] = O::LoadU(src);
          } else {
            alignas(64) float tmp[N] = {};
            std::copy(src, src + dims, tmp);
            r[w] = O::Load(tmp);
          }
        }
        O::Transpose(r);
        for (std::int64_t d = 0; d < dims; ++d) O::Store(r[d], dst + (d0 + d) * W + part * N);
      }
    }
  }
  PackV<O>(p, g, b, hk, j0, nk, vp);
}

// Streaming scores for a few query rows (decode): S[r][j] = Qd[r] . K[j] with K read in place,
// row after row, so the stream runs at memory speed and nothing is packed. One K vector load
// serves R rows; a horizontal sum per score is affordable because there are few rows.
template <class O, int R>
HWY_INLINE void DotScoresR(const float* HWY_RESTRICT qd, std::int64_t dp, std::int64_t D,
                           const float* HWY_RESTRICT k, std::int64_t ks, std::int64_t nk,
                           float* HWY_RESTRICT s, std::int64_t s_stride) {
  constexpr int N = O::kLanes;
  const std::int64_t dv = D / N * N;
  for (std::int64_t j = 0; j < nk; ++j) {
    const float* krow = k + j * ks;
    typename O::V acc[R];
    HWY_UNROLL(16)
    for (int r = 0; r < R; ++r) acc[r] = O::Zero();
    for (std::int64_t d = 0; d < dv; d += N) {
      const typename O::V kv = O::LoadU(krow + d);
      HWY_UNROLL(16)
      for (int r = 0; r < R; ++r) acc[r] = O::MulAdd(O::Load(qd + r * dp + d), kv, acc[r]);
    }
    HWY_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      float tail = 0.0f;
      for (std::int64_t d = dv; d < D; ++d) tail += qd[r * dp + d] * krow[d];
      s[r * s_stride + j] = O::ReduceSum(acc[r]) + tail;
    }
  }
}

template <class O>
void DotScores(int R, const float* qd, std::int64_t dp, std::int64_t D, const float* k,
               std::int64_t ks, std::int64_t nk, float* s, std::int64_t s_stride) {
  switch (R) {
#define CPUATTN_DOT_CASE(n)                              \
  case n:                                                \
    DotScoresR<O, n>(qd, dp, D, k, ks, nk, s, s_stride); \
    break;
    CPUATTN_DOT_CASE(1)
    CPUATTN_DOT_CASE(2)
    CPUATTN_DOT_CASE(3)
    CPUATTN_DOT_CASE(4)
    CPUATTN_DOT_CASE(5)
    CPUATTN_DOT_CASE(6)
    CPUATTN_DOT_CASE(7)
    CPUATTN_DOT_CASE(8)
#undef CPUATTN_DOT_CASE
    default:
      break;
  }
}

// Element-wise masks of one streamed score row (the tiled path does this in its epilogue).
inline void MaskScoreRow(float* HWY_RESTRICT srow, std::int64_t ncols, const RowMask& rm,
                         const MaskInfo& mi) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < ncols; ++j) {
    if (j >= rm.end) {
      srow[j] = neg_inf;
    } else if (rm.mask != nullptr) {
      if (mi.kind == detail::MaskKind::additive) {
        srow[j] += static_cast<const float*>(rm.mask)[j * mi.stride] * 1.4426950408889634f;
      } else if (static_cast<const std::uint8_t*>(rm.mask)[j * mi.stride] == 0) {
        srow[j] = neg_inf;
      }
    }
  }
}

// Copies the block's query rows, Qp[row][0:D] (row stride qs, zero-padded to it), scaled by
// scale * log2(e) so that the softmax runs in base 2. Row-major, not transposed: the score
// micro-kernel broadcasts one float per row and d from R row pointers (6 with AVX-512, which fit
// the general registers), and the copy is then a load, a multiply and a store per vector. (Against
// the transposed Qp[d][row] it replaces, measured: S1 +5-14%, and the score tile on L1 data from
// 87% to 90% of the FMA probe.)
template <class O>
void PackQ(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
           std::int64_t pos0, int rows, float qscale, std::int64_t qs, float* HWY_RESTRICT qp) {
  constexpr int N = O::kLanes;
  const typename O::V vscale = O::Set(qscale);
  const std::int64_t dv = p.D / N * N;
  for (int r = 0; r < rows; ++r) {
    const float* src = static_cast<const float*>(p.q.data) + b * p.q.s[0] +
                       (h0 + r % nh) * p.q.s[1] + (pos0 + r / nh) * p.q.s[2];
    float* dst = qp + r * qs;
    for (std::int64_t d = 0; d < dv; d += N) O::Store(O::Mul(O::LoadU(src + d), vscale), dst + d);
    if (dv < qs) {
      alignas(64) float tmp[N] = {};
      std::copy(src + dv, src + p.D, tmp);
      O::Store(O::Mul(O::Load(tmp), vscale), dst + dv);
      std::fill(dst + dv + N, dst + qs, 0.0f);
    }
  }
}

// At most this many query rows in a block take the streaming path when K/V are not reused.
inline constexpr int kStreamRows = 8;

// Runs task t of the plan: one (batch, K/V head, head split, chunk of query blocks, key split).
// K/V blocks are packed once per task: kept for all query blocks when the chunk has several,
// else packed into one reused slot (decode), so K/V far larger than the caches stream once.
template <class O>
void RunTaskImpl(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
                 detail::Scratch& scratch) {
  constexpr int N = O::kLanes;
  constexpr int W = Geometry<O>::W;
  constexpr int CW = Geometry<O>::CW;
  const Geometry<O> g(p, O::kBlockKeys);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float kLog2e = 1.4426950408889634f;

  const std::int64_t ks = t % pl.k_splits;
  t /= pl.k_splits;
  const std::int64_t qc = t % pl.q_chunks;
  t /= pl.q_chunks;
  const std::int64_t hs = t % pl.head_splits;
  t /= pl.head_splits;
  const std::int64_t hk = t % p.Hkv;
  const std::int64_t b = t / p.Hkv;

  const std::int64_t nh = std::min(pl.heads_per_block, p.group - hs * pl.heads_per_block);
  const std::int64_t h0 = hk * p.group + hs * pl.heads_per_block;
  const std::int64_t qb0 = qc * pl.blocks_per_chunk;
  const std::int64_t qb1 = std::min(pl.q_blocks, qb0 + pl.blocks_per_chunk);
  const std::int64_t k0 = ks * pl.keys_per_split;
  const std::int64_t k1 = std::min(p.Lk, k0 + pl.keys_per_split);
  const bool keep_packed = qb1 - qb0 > 1;

  // Scratch: Qp, S, Acc, m, l, row masks, then the packed K/V blocks.
  const detail::TaskScratch ts(p, pl, k1 - k0, g.Nk, g.DvP, keep_packed);
  float* base = scratch.get(ts.total);
  float* qp = base + ts.qp;
  const std::int64_t qs = static_cast<std::int64_t>(ts.qp_stride);
  float* s = base + ts.s;
  float* acc = base + ts.acc;
  float* m = base + ts.m;
  float* l = base + ts.l;
  RowMask* rm = reinterpret_cast<RowMask*>(base + ts.rm);
  static_assert(sizeof(RowMask) <= 4 * sizeof(float) && alignof(RowMask) <= 64);
  float* kv = base + ts.kv;
  std::int64_t packed_blocks = 0;  // with keep_packed: blocks [0, packed_blocks) are ready

  const MaskInfo mi{p.mask_kind, p.mask.s[3]};
  const float qscale = static_cast<float>(p.scale) * kLog2e;

  for (std::int64_t qb = qb0; qb < qb1; ++qb) {
    const std::int64_t pos0 = qb * pl.pos_per_block;
    const std::int64_t pos1 = std::min(p.Lq, pos0 + pl.pos_per_block);
    const int rows = static_cast<int>((pos1 - pos0) * nh);
    // Few rows (decode) and no K/V reuse across query blocks: stream K/V in place.
    const bool stream = !keep_packed && rows <= kStreamRows;
    PackQ<O>(p, b, h0, nh, pos0, rows, qscale, qs, qp);
    // l is kept per row as a vector of partial sums and summed across lanes once, at the end,
    // instead of a horizontal sum per row and block.
    for (int r = 0; r < rows; ++r) {
      m[r] = neg_inf;
      O::Store(O::Zero(), l + r * N);
    }
    std::fill(acc, acc + rows * g.DvP, 0.0f);
    // Causal and key-length limits: rows see keys [0, end(i)), end non-decreasing in i.
    const std::int64_t end_lo = std::min(k1, p.key_end(b, pos0));
    const std::int64_t end_hi = std::min(k1, p.key_end(b, pos1 - 1));

    for (std::int64_t kb0 = k0; kb0 < end_hi; kb0 += g.Nk) {
      const std::int64_t nk = std::min(g.Nk, k1 - kb0);
      const std::int64_t slot = keep_packed ? (kb0 - k0) / g.Nk : 0;
      float* kp = kv + slot * g.kv_block_floats();
      float* vp = kp + g.k_block_floats();
      // V is read in place when its rows are whole vectors; otherwise packed (zero-padded).
      const bool v_in_place = stream && g.DvP == g.Dv;
      const bool first_use = !keep_packed || slot >= packed_blocks;
      if (first_use) {
        // Ask for the K/V rows two blocks ahead now, so that their misses overlap this block's
        // work instead of stalling a later one (+25% on X1 measured; decode unchanged).
        if (kb0 == k0)
          PrefetchKV(p, b, hk, kb0 + g.Nk, std::clamp<std::int64_t>(k1 - kb0 - g.Nk, 0, g.Nk));
        if (kb0 + 2 * g.Nk < k1)
          PrefetchKV(p, b, hk, kb0 + 2 * g.Nk, std::min(g.Nk, k1 - kb0 - 2 * g.Nk));
      }
      if (stream) {
        if (!v_in_place) PackV<O>(p, g, b, hk, kb0, nk, vp);
      } else if (first_use) {
        PackKV<O>(p, g, b, hk, kb0, nk, kp, vp);
        if (keep_packed) packed_blocks = slot + 1;
      }
      // Keys of this block that some row may see, rounded up to whole panels.
      const std::int64_t nk_live = std::min(nk, end_hi - kb0);
      const std::int64_t ncols = (nk_live + W - 1) / W * W;
      // Columns [0, clean) need no per-element mask for any row.
      const std::int64_t clean = p.mask_kind != detail::MaskKind::none
                                     ? 0
                                     : std::max<std::int64_t>(0, std::min(nk, end_lo - kb0));
      // Row r is (position pos0 + r / nh, head h0 + r % nh); nested loops avoid a 64-bit
      // division per row and block.
      for (std::int64_t i = pos0, r = 0; i < pos1; ++i) {
        const auto end = static_cast<std::int32_t>(
            std::clamp<std::int64_t>(std::min(k1, p.key_end(b, i)) - kb0, 0, nk));
        for (std::int64_t h = h0; h < h0 + nh; ++h, ++r) {
          rm[r].end = end;
          rm[r].mask =
              p.mask_kind == detail::MaskKind::none
                  ? nullptr
                  : static_cast<const char*>(p.mask.data) +
                        (b * p.mask.s[0] + h * p.mask.s[1] + i * p.mask.s[2] + kb0 * p.mask.s[3]) *
                            static_cast<std::int64_t>(dtype_size(p.mask.dtype));
        }
      }

      // 1. Scores, masked in the micro-kernel epilogue where needed.
      if (stream) {
        const float* K =
            static_cast<const float*>(p.k.data) + b * p.k.s[0] + hk * p.k.s[1] + kb0 * p.k.s[2];
        DotScores<O>(rows, qp, qs, g.D, K, p.k.s[2], nk_live, s, g.Nk);
        for (int r = 0; r < rows; ++r) MaskScoreRow(s + r * g.Nk, ncols, rm[r], mi);
      }
      for (std::int64_t c0 = 0; c0 < (stream ? 0 : ncols); c0 += W) {
        const float* panel = kp + (c0 / W) * g.D * W;
        const bool masked = c0 + W > clean;
        for (int r0 = 0; r0 < rows; r0 += O::kScoreRows) {
          const int R = std::min(O::kScoreRows, rows - r0);
          if (masked) {
            ScoreRows<O, true>(R, qp + r0 * qs, qs, g.D, panel, s + r0 * g.Nk + c0, g.Nk,
                               static_cast<std::int32_t>(c0), rm + r0, mi);
          } else {
            ScoreRows<O, false>(R, qp + r0 * qs, qs, g.D, panel, s + r0 * g.Nk + c0, g.Nk,
                                static_cast<std::int32_t>(c0), rm + r0, mi);
          }
        }
      }

      // 2. Online softmax: rescale the accumulator only when a row's max grows.
      // ncols is a whole number of panels, an even number of vectors: two accumulators per
      // pass halve the dependency chains.
      static_assert(O::kScoreCols % 2 == 0, "the passes below take vectors in pairs");
      for (int r = 0; r < rows; ++r) {
        float* srow = s + r * g.Nk;
        float* lrow = l + r * N;
        typename O::V vmax0 = O::Set(neg_inf), vmax1 = vmax0;
        for (std::int64_t c = 0; c < ncols; c += 2 * N) {
          vmax0 = O::Max(vmax0, O::Load(srow + c));
          vmax1 = O::Max(vmax1, O::Load(srow + c + N));
        }
        const float block_max = O::ReduceMax(O::Max(vmax0, vmax1));
        // A NaN score poisons its row (as in the reference); std::max would drop it.
        const float m_new = (block_max > m[r] || std::isnan(block_max)) ? block_max : m[r];
        if (m_new == neg_inf) {
          // Nothing visible yet, unless the vector max dropped a NaN (x86 max returns its
          // second operand when either is NaN): then the row is poisoned, as in the reference.
          if (std::any_of(srow, srow + ncols, [](float x) { return std::isnan(x); })) {
            m[r] = std::numeric_limits<float>::quiet_NaN();
            O::Store(O::Set(m[r]), lrow);
          }
          std::fill(srow, srow + ncols, 0.0f);
          continue;
        }
        if (!(m_new == m[r])) {
          // Nothing accumulated while m was -inf; otherwise rescale l and Acc.
          if (m[r] != neg_inf) {
            const typename O::V va = O::Exp2(O::Set(m[r] - m_new));
            O::Store(O::Mul(O::Load(lrow), va), lrow);
            float* arow = acc + r * g.DvP;
            for (std::int64_t c = 0; c < g.DvP; c += O::kLanes)
              O::Store(O::Mul(O::Load(arow + c), va), arow + c);
          }
          m[r] = m_new;
        }
        const typename O::V vm = O::Set(m[r]);
        typename O::V vsum0 = O::Zero(), vsum1 = O::Zero();
        for (std::int64_t c = 0; c < ncols; c += 2 * N) {
          const typename O::V e0 = O::Exp2(O::Sub(O::Load(srow + c), vm));
          const typename O::V e1 = O::Exp2(O::Sub(O::Load(srow + c + N), vm));
          O::Store(e0, srow + c);
          O::Store(e1, srow + c + N);
          vsum0 = O::Add(vsum0, e0);
          vsum1 = O::Add(vsum1, e1);
        }
        O::Store(O::Add(O::Load(lrow), O::Add(vsum0, vsum1)), lrow);
      }

      // 3. Acc += P V, one column chunk of V at a time so the chunk stays in L1.
      for (std::int64_t c0 = 0; c0 < g.DvP; c0 += CW) {
        const std::int64_t cw = std::min<std::int64_t>(CW, g.DvP - c0);
        const float* vchunk = vp + c0 * nk;
        std::int64_t vstride = cw;
        if (v_in_place) {
          vchunk = static_cast<const float*>(p.v.data) + b * p.v.s[0] + hk * p.v.s[1] +
                   kb0 * p.v.s[2] + c0;
          vstride = p.v.s[2];
        }
        for (int r0 = 0; r0 < rows; r0 += O::kPvRows) {
          const int R = std::min(O::kPvRows, rows - r0);
          PvRows<O>(R, static_cast<int>(cw / O::kLanes), s + r0 * g.Nk, g.Nk, vchunk, vstride,
                    nk_live, acc + r0 * g.DvP + c0, g.DvP);
        }
      }
    }

    // 4. Normalize once, or hand the unnormalized state to the merge.
    for (int r = 0; r < rows; ++r) {
      const std::int64_t i = pos0 + r / nh, h = h0 + r % nh;
      const float* arow = acc + r * g.DvP;
      const float lr = O::ReduceSum(O::Load(l + r * N));
      if (pl.k_splits > 1) {
        float* dst = detail::partial_row(p, pl, b, h, i, ks);
        dst[0] = m[r];
        dst[1] = lr;
        std::copy(arow, arow + g.Dv, dst + 2);
        continue;
      }
      float* dst = static_cast<float*>(p.out) + b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
      const bool empty = m[r] == neg_inf;
      const float inv = empty ? 0.0f : 1.0f / lr;
      if (pl.stream_out && g.Dv == g.DvP &&
          reinterpret_cast<std::uintptr_t>(dst) % (N * sizeof(float)) == 0) {
        const typename O::V vinv = O::Set(inv);
        for (std::int64_t d = 0; d < g.Dv; d += N)
          O::Stream(O::Mul(O::Load(arow + d), vinv), dst + d);
      } else {
        for (std::int64_t d = 0; d < g.Dv; ++d) dst[d] = arow[d] * inv;
      }
      if (p.lse != nullptr) {
        static_cast<float*>(p.lse)[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] =
            empty ? neg_inf : (m[r] + std::log2(lr)) * 0.6931471805599453f;
      }
    }
  }
  // Non-temporal stores are weakly ordered: complete them before the task reports done.
  if (pl.stream_out) O::StreamFence();
}

// The unfused baseline the benchmarks compare against: three passes over a materialized
// [Lq, Lk] score matrix per head (scores as SIMD dot products, softmax, then P V), no tiling.
// Handles the scale and GQA; masks are out of its scope (it exists to be measured).
template <class O>
void RunUnfusedHeadImpl(const detail::Problem& p, std::int64_t b, std::int64_t h,
                        detail::Scratch& scratch) {
  constexpr int N = O::kLanes;
  const std::int64_t hk = h / p.group;
  const std::int64_t LkP = (p.Lk + N - 1) / N * N, DvP = (p.Dv + N - 1) / N * N;
  float* s = scratch.get(static_cast<std::size_t>(p.Lq * LkP + DvP + N));
  float* acc = s + p.Lq * LkP;
  const float* Q = static_cast<const float*>(p.q.data) + b * p.q.s[0] + h * p.q.s[1];
  const float* K = static_cast<const float*>(p.k.data) + b * p.k.s[0] + hk * p.k.s[1];
  const float* V = static_cast<const float*>(p.v.data) + b * p.v.s[0] + hk * p.v.s[1];
  const float qscale = static_cast<float>(p.scale) * 1.4426950408889634f;
  const std::int64_t Dvec = p.D / N * N;
  for (std::int64_t i = 0; i < p.Lq; ++i) {  // pass 1: scores
    const float* q = Q + i * p.q.s[2];
    for (std::int64_t j = 0; j < p.Lk; ++j) {
      const float* k = K + j * p.k.s[2];
      typename O::V dot = O::Zero();
      for (std::int64_t d = 0; d < Dvec; d += N)
        dot = O::MulAdd(O::LoadU(q + d), O::LoadU(k + d), dot);
      float tail = 0;
      for (std::int64_t d = Dvec; d < p.D; ++d) tail += q[d] * k[d];
      s[i * LkP + j] = (O::ReduceSum(dot) + tail) * qscale;
    }
    for (std::int64_t j = p.Lk; j < LkP; ++j)
      s[i * LkP + j] = -std::numeric_limits<float>::infinity();
  }
  for (std::int64_t i = 0; i < p.Lq; ++i) {  // pass 2: softmax, normalized
    float* row = s + i * LkP;
    typename O::V vmax = O::Set(-std::numeric_limits<float>::infinity());
    for (std::int64_t j = 0; j < LkP; j += N) vmax = O::Max(vmax, O::Load(row + j));
    const typename O::V vm = O::Set(O::ReduceMax(vmax));
    typename O::V vsum = O::Zero();
    for (std::int64_t j = 0; j < LkP; j += N) {
      const typename O::V e = O::Exp2(O::Sub(O::Load(row + j), vm));
      O::Store(e, row + j);
      vsum = O::Add(vsum, e);
    }
    const typename O::V inv = O::Set(1.0f / O::ReduceSum(vsum));
    for (std::int64_t j = 0; j < LkP; j += N) O::Store(O::Mul(O::Load(row + j), inv), row + j);
  }
  for (std::int64_t i = 0; i < p.Lq; ++i) {  // pass 3: out = P V
    std::fill(acc, acc + DvP, 0.0f);
    for (std::int64_t j = 0; j < p.Lk; ++j) {
      const typename O::V w = O::Set(s[i * LkP + j]);
      const float* v = V + j * p.v.s[2];
      std::int64_t d = 0;
      for (; d + N <= p.Dv; d += N)
        O::Store(O::MulAdd(w, O::LoadU(v + d), O::Load(acc + d)), acc + d);
      for (; d < p.Dv; ++d) acc[d] += s[i * LkP + j] * v[d];
    }
    float* dst = static_cast<float*>(p.out) + b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
    std::copy(acc, acc + p.Dv, dst);
  }
}

#endif  // CPUATTN_FLASH_INL_H_
