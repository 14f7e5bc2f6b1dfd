// The dense product behind Linear and the layers: C = A B (+ bias), A and C given by rows,
// B packed once into column panels. Files: gemm-inl.h (micro-kernel and task), entry-inl.h (the
// per-target table), gemv-inl.h (few rows of A), gemm_hwy.cc and gemm_xsimd.cc (the units).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/inline.h"
#include "core/scratch.h"
#include "cpuattn/cpuattn.h"
#include "dispatch/dispatch.h"

namespace cpuattn::detail {

// B [K, N] packed as ceil(N / kPanel) panels, each [K][kPanel] row-major with the columns past N
// zero. One panel row is 32 floats = 128 bytes, two AVX-512 vectors (four AVX2, eight SSE4):
// the micro-kernel streams it with aligned loads, and a panel of kc = 256 rows (32 KiB) stays in
// the 48 KiB L1d while every row block of A sweeps it. The layout does not depend on the SIMD
// target, so a packed matrix serves every target. bf16 weights stay bf16 (same layout, 64-byte
// panel rows): half the bytes a memory-bound product (decoding: few rows of A) streams, widened to
// f32 in the micro-kernel as each panel row is loaded.
struct PackedMatrix {
  static constexpr std::int64_t kPanel = 32;
  std::int64_t K = 0, N = 0, panels = 0;
  DType dtype = DType::f32;  // f32 or bf16
  Scratch data;              // panels * K * kPanel elements of dtype
  Scratch bias;              // panels * kPanel floats, or empty
  bool has_bias = false;
  CPUATTN_ALWAYS_INLINE const float* panel(std::int64_t p) const {
    return data.data() + p * K * kPanel;
  }
  CPUATTN_ALWAYS_INLINE const std::uint16_t* panel_bf16(std::int64_t p) const {
    return reinterpret_cast<const std::uint16_t*>(data.data()) + p * K * kPanel;
  }
};

// Row addressing for up to three leading dimensions: row r of a [d0, d1, d2, cols] view is at
// sum_i index_i(r) * stride_i. Layers pass [B, L, features] slices of wider buffers.
struct Rows {
  float* data = nullptr;
  std::int64_t dims[3] = {1, 1, 1};
  std::int64_t strides[3] = {0, 0, 0};
  CPUATTN_ALWAYS_INLINE float* row(std::int64_t r) const {
    const std::int64_t i2 = r % dims[2], r1 = r / dims[2];
    const std::int64_t i1 = r1 % dims[1], i0 = r1 / dims[1];
    return data + i0 * strides[0] + i1 * strides[1] + i2 * strides[2];
  }
};

// Micro-panels per task row block (96 rows on AVX-512): its packed rows of A, 96 x K floats,
// stay in L2 while every panel of B passes.
inline constexpr std::int64_t kGemmRowPanels = 8;

struct GemmProblem {
  Rows a;  // M rows of K floats (read only)
  Rows c;  // M rows of N floats
  std::int64_t M = 0;
  const PackedMatrix* b = nullptr;
  // Tasks: row blocks x panel blocks. Every C element sums over K in the same order whatever
  // the blocking (k blocks of kKc, in order), so the blocking may follow the thread count.
  std::int64_t row_block = 0;    // rows per task, a multiple of the micro-kernel's rows
  std::int64_t panel_block = 0;  // panels per task
  std::int64_t row_tasks = 0, panel_tasks = 0;
  // The panels of B computed, [p_begin, p_end) (p_end < 0: to the last); C's column 0 is panel
  // p_begin's first (a part of a fused matrix, kernels/gemm/gemm.h pack_parts).
  std::int64_t p_begin = 0, p_end = -1;
};

// Products of at most this many rows of A (a decoding step's batch) take the matrix-vector path
// on every target: B streams once whatever the micro-kernel's rows (kernels/gemm/gemv-inl.h).
inline constexpr std::int64_t kGemvRows = 12;

struct GemmKernels {
  std::int64_t rows;  // rows of the micro-kernel's tile
  // Task t of a planned product (row block t / panel_tasks, panel block t % panel_tasks).
  void (*task)(const GemmProblem&, std::int64_t t, Scratch&);
  // The same for M <= kGemvRows (decoding): one row task, panel blocks only.
  void (*gemv_task)(const GemmProblem&, std::int64_t t, Scratch&);
};

const GemmKernels& gemm_kernels(const Choice& choice);

// Runs C = A B (+ bias) with the context's threads on the kernels of its target.
void run_gemm(GemmProblem& g, Context& ctx);

// B packed from `weights` ([K, N_i] each, f32 or bf16 alike; biases optional, one per weight)
// side by side. With `aligned`, each part starts on a panel boundary (zero columns pad the part
// before it): a part is then a panel range that run_linear_panels computes alone. Throws Error
// naming the argument on a bad weight or bias.
std::shared_ptr<const PackedMatrix> pack_parts(const std::vector<TensorView>& weights,
                                               const std::vector<std::optional<TensorView>>& biases,
                                               bool aligned);

// y = x B over panels [p_begin, p_end) of B: x [.., K] (rank 2..4, validated by the caller), y
// rows of y_stride floats, one per row of x, receiving (p_end - p_begin) * kPanel columns.
void run_linear_panels(const PackedMatrix& b, const TensorView& x, float* y, std::int64_t y_stride,
                       std::int64_t p_begin, std::int64_t p_end, Context& ctx);

}  // namespace cpuattn::detail

CPUATTN_DECLARE_UNIT_TABLES(GemmKernels, GetGemmKernels)
