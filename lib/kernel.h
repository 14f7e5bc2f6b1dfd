// Interface between the target-independent driver (attention.cpp: planning, threading, merging)
// and the per-target SIMD kernels (kernels_hwy.cc, compiled once per Highway target).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "problem.h"

namespace cpuattn::detail {

// Growable 64-byte-aligned float buffer. Grows only, so steady-state calls do not allocate.
class Scratch {
 public:
  float* get(std::size_t floats) {
    if (floats > capacity_) {
      const std::size_t bytes = ((floats * sizeof(float) + 63) / 64) * 64;
      buf_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (!buf_) throw std::bad_alloc();
      capacity_ = bytes / sizeof(float);
    }
    return buf_.get();
  }
  float* data() const { return buf_.get(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t bytes() const { return capacity_ * sizeof(float); }
  void release() {
    buf_.reset();
    capacity_ = 0;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> buf_;
  std::size_t capacity_ = 0;
};

// How one call is cut into tasks. Derived from the shape only, never from the thread count, so
// that results are bitwise identical for any number of threads.
struct Plan {
  std::int64_t rows = 0;          // query rows per block (positions x heads), <= block_rows
  std::int64_t heads_per_block;   // nh: query heads of one K/V group folded into a block
  std::int64_t pos_per_block;     // np: query positions per block
  std::int64_t head_splits;       // ceil(group / nh): blocks across one group's heads
  std::int64_t q_blocks;          // ceil(Lq / np)
  std::int64_t q_chunks;          // tasks per (b, kv head, head split) along the queries
  std::int64_t blocks_per_chunk;  // q blocks per chunk
  std::int64_t k_splits;          // tasks along the keys (merged afterwards); 1 = no split
  std::int64_t keys_per_split;    // multiple of the kernel's key block
  std::int64_t tasks;             // B * Hkv * head_splits * q_chunks * k_splits

  // A task's partial results when k_splits > 1: for each of its rows, (m, l, acc[Dv]) with acc
  // unnormalized and m in log2 units; indexed [unit][split][row], unit = one q block.
  float* partials = nullptr;
  std::int64_t partial_row_floats = 0;  // Dv + 2

  // Write the output rows with non-temporal stores (where a row is whole aligned vectors).
  bool stream_out = false;
};

struct GemmProblem;
struct AdditiveProblem;

struct KernelInfo {
  Target target;
  const char* name;         // Highway's name of the target
  std::int64_t lanes;       // f32 lanes per vector
  std::int64_t block_rows;  // max query rows per block
  std::int64_t block_keys;  // keys per K/V block
  // Runs task `t` of `plan`. Writes out/lse directly, or partials when plan.k_splits > 1.
  void (*run_task)(const Problem&, const Plan&, std::int64_t t, Scratch&);
  // Vector exp2 over an array (for tests and the micro-benchmark).
  void (*exp2)(const float* in, float* out, std::size_t n);
  // FMA throughput probe for `cpuattn bench`: runs `iters` rounds of independent FMAs and
  // returns the number of flops executed.
  double (*fma_probe)(std::int64_t iters);
  // The score micro-kernel on L1-resident data, `reps` times; returns the flops executed.
  double (*tile_probe)(std::int64_t reps);
  // Read-bandwidth probe: sums n floats (n a multiple of 64) with vector loads.
  float (*read_probe)(const float* data, std::size_t n);
  // The unfused three-pass baseline for one (b, h): no masks. For benchmarks.
  void (*run_unfused_head)(const Problem&, std::int64_t b, std::int64_t h, Scratch&);
  // Dense product (gemm.h): rows of the micro-kernel, and task t of a planned product.
  std::int64_t gemm_rows;
  void (*gemm_task)(const GemmProblem&, std::int64_t t, Scratch&);
  // Vector tanh over an array (for tests and benchmarks).
  void (*tanh)(const float* in, float* out, std::size_t n);
  // Additive attention (layers_kernel.h): task t = one query row.
  void (*additive_task)(const AdditiveProblem&, std::int64_t t, Scratch&);
};

// Layout of one task's scratch, in floats from a 64-byte aligned base. Every array starts on a
// 64-byte boundary, so the kernels' aligned vector loads hold whatever the row count.
struct TaskScratch {
  std::size_t qp, qp_stride, s, acc, m, l, rm, kv, total;
  TaskScratch(const Problem& p, const Plan& pl, std::int64_t task_keys, std::int64_t block_keys,
              std::int64_t dv_padded, bool keep_packed) {
    const auto rows = static_cast<std::size_t>(pl.rows);
    std::size_t at = 0;
    auto take = [&](std::size_t floats) {
      const std::size_t start = at;
      at += (floats + 15) / 16 * 16;
      return start;
    };
    qp_stride = (static_cast<std::size_t>(p.D) + 15) / 16 * 16;  // Qp is [rows][D], D padded
    qp = take(rows * qp_stride);
    s = take(rows * block_keys);
    acc = take(rows * dv_padded);
    m = take(rows);
    l = take(rows * 16);  // a vector of partial sums per row (<= 16 f32 lanes)
    rm = take(rows * 4);  // one RowMask (<= 16 bytes) per row
    const std::int64_t blocks = keep_packed ? (task_keys + block_keys - 1) / block_keys : 1;
    kv = take(static_cast<std::size_t>(blocks * block_keys * (p.D + dv_padded)));
    total = at;
  }
};

// Where task split `ks` leaves its (m, l, acc[Dv]) for query row (b, h, i).
inline float* partial_row(const Problem& p, const Plan& pl, std::int64_t b, std::int64_t h,
                          std::int64_t i, std::int64_t ks) {
  const std::int64_t row = (b * p.H + h) * p.Lq + i;
  return pl.partials + (row * pl.k_splits + ks) * pl.partial_row_floats;
}

// Runs the unfused baseline over every (b, h) with the context's threads (no masks allowed).
void run_unfused(const Problem& p, Context& ctx);

// The kernels for the best target this CPU supports, capped at `cap`.
const KernelInfo& kernels_for(Target cap);

}  // namespace cpuattn::detail
