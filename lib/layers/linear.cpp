// Linear: packing of the weights, validation, and the threaded driver of the dense product.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "api/call_scope.h"
#include "api/checks.h"
#include "api/context_impl.h"
#include "cpuattn/layers.h"
#include "kernels/gemm/gemm.h"

namespace cpuattn {
namespace detail {

void run_gemm(GemmProblem& g, Context& ctx) {
  Context::Impl& c = ContextAccess::impl(ctx);
  const GemmKernels& gk = gemm_kernels(choose(&ctx));
  const std::int64_t mr = gk.rows;
  Recorder* rec = current_recorder();
  c.run([&] {
    // Blocking only decides which thread computes what (each C element sums in the same order
    // whatever the blocks, and on either path), so it may follow the thread count. Row blocks of
    // 8 micro-panels (96 rows on AVX-512) keep the packed rows in L2; when that leaves fewer than
    // 4 tasks per thread (short inputs, decoding) the panels are split as well. At most kGemvRows
    // rows (decoding) take the matrix-vector path, which streams B once, in one row block.
    const std::int64_t threads = tbb::this_task_arena::max_concurrency();
    const std::int64_t want = 4 * threads;
    if (g.p_end < 0) g.p_end = g.b->panels;
    const std::int64_t panels = g.p_end - g.p_begin;
    const bool gemv = g.M <= kGemvRows;
    g.row_block = gemv ? g.M : std::min((g.M + mr - 1) / mr, kGemmRowPanels) * mr;
    g.row_tasks = (g.M + g.row_block - 1) / g.row_block;
    g.panel_block = panels;
    while (g.row_tasks * ((panels + g.panel_block - 1) / g.panel_block) < want &&
           g.panel_block > 1) {
      g.panel_block = (g.panel_block + 1) / 2;
    }
    g.panel_tasks = (panels + g.panel_block - 1) / g.panel_block;
    const auto task = gemv ? gk.gemv_task : gk.task;
    if (rec != nullptr) {
      const double M = static_cast<double>(g.M), K = static_cast<double>(g.b->K),
                   N = static_cast<double>(std::min(g.b->N - g.p_begin * PackedMatrix::kPanel,
                                                    panels * PackedMatrix::kPanel));
      rec->add_work(2 * M * K * N,
                    4 * (M * K + M * N) + static_cast<double>(dtype_size(g.b->dtype)) * K * N);
      rec->add_tasks(g.row_tasks * g.panel_tasks);
    }
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, g.row_tasks * g.panel_tasks, 1),
        [&](const tbb::blocked_range<std::int64_t>& r) {
          Scratch& s = c.task_scratch.local();
          const Context::Impl::Lease lease{c, s};
          for (std::int64_t t = r.begin(); t < r.end(); ++t) {
            const TaskTimer timer(rec, t, Phase::gemm);
            task(g, t, s);
          }
        },
        tbb::simple_partitioner());
  });
}

namespace {

// Rows of a [..., cols] view: its leading dimensions (up to three) with their strides.
Rows rows_of(const TensorView& t) {
  Rows r;
  r.data = static_cast<float*>(const_cast<void*>(t.data));
  const int lead = t.rank - 1;
  for (int d = 0; d < lead; ++d) {
    r.dims[3 - lead + d] = t.shape[d];
    r.strides[3 - lead + d] = t.strides[d];
  }
  return r;
}

std::int64_t rows_count(const TensorView& t) {
  std::int64_t m = 1;
  for (int d = 0; d + 1 < t.rank; ++d) m *= t.shape[d];
  return m;
}

}  // namespace
}  // namespace detail

using detail::fail;
using detail::shape_str;

Linear::Linear(std::shared_ptr<const detail::PackedMatrix> m) : m_(std::move(m)) {}

Linear::Linear(const TensorView& weight, const std::optional<TensorView>& bias)
    : Linear(concat({weight}, {bias})) {}

namespace detail {

std::shared_ptr<const PackedMatrix> pack_parts(const std::vector<TensorView>& weights,
                                               const std::vector<std::optional<TensorView>>& biases,
                                               bool aligned) {
  constexpr std::int64_t P = PackedMatrix::kPanel;
  const auto part_width = [&](std::int64_t n) { return aligned ? (n + P - 1) / P * P : n; };
  if (weights.empty()) fail("Linear: no weight matrix given");
  if (!biases.empty() && biases.size() != weights.size()) {
    fail("Linear: " + std::to_string(biases.size()) + " biases for " +
         std::to_string(weights.size()) + " weight matrices (give none, or one per matrix)");
  }
  std::int64_t K = 0, N = 0;
  bool any_bias = false;
  for (std::size_t w = 0; w < weights.size(); ++w) {
    const std::string name = "weight " + std::to_string(w);
    detail::check_view(name.c_str(), weights[w], 2, 2);
    if (weights[w].dtype != DType::f32 && weights[w].dtype != DType::bf16) {
      fail(name + " " + shape_str(weights[w]) + " has dtype " + dtype_name(weights[w].dtype) +
           "; expected float32 or bfloat16");
    }
    if (weights[w].dtype != weights[0].dtype) {
      fail(name + " has dtype " + dtype_name(weights[w].dtype) + " but weight 0 has " +
           dtype_name(weights[0].dtype) + " (concatenated matrices share a dtype)");
    }
    if (reinterpret_cast<std::uintptr_t>(weights[w].data) % dtype_size(weights[w].dtype) != 0)
      fail(name + " " + shape_str(weights[w]) + ": data is not aligned to its elements");
    detail::extent_of(name.c_str(), weights[w]);
    if (w == 0) K = weights[w].shape[0];
    if (weights[w].shape[0] != K) {
      fail(name + " " + shape_str(weights[w]) + " has K=" + std::to_string(weights[w].shape[0]) +
           " but weight 0 has K=" + std::to_string(K) + " (concatenated matrices share K)");
    }
    if (!biases.empty() && biases[w]) {
      const std::string bname = "bias " + std::to_string(w);
      detail::check_view(bname.c_str(), *biases[w], 1, 1);
      detail::check_dtype(bname.c_str(), *biases[w], false);
      if (biases[w]->shape[0] != weights[w].shape[1]) {
        fail(bname + " " + shape_str(*biases[w]) + " does not match " + name + " " +
             shape_str(weights[w]) + " (expected [" + std::to_string(weights[w].shape[1]) + "])");
      }
      any_bias = true;
    }
    N += part_width(weights[w].shape[1]);
  }
  auto m = std::make_shared<PackedMatrix>();
  m->K = K;
  m->N = N;
  m->panels = (N + P - 1) / P;
  m->dtype = weights[0].dtype;
  const bool bf16 = m->dtype == DType::bf16;
  // bf16 panels take half the floats of the buffer (two elements per float slot).
  const std::int64_t elems = m->panels * K * P;
  float* dst = m->data.get(static_cast<std::size_t>(bf16 ? (elems + 1) / 2 : elems));
  std::fill(dst, dst + (bf16 ? (elems + 1) / 2 : elems), 0.0f);
  auto* dst16 = reinterpret_cast<std::uint16_t*>(dst);
  float* bias = nullptr;
  if (any_bias) {
    m->has_bias = true;
    bias = m->bias.get(static_cast<std::size_t>(m->panels * P));
    std::fill(bias, bias + m->panels * P, 0.0f);
  }
  std::int64_t col0 = 0;
  for (std::size_t w = 0; w < weights.size(); ++w) {
    const TensorView& wt = weights[w];
    for (std::int64_t k = 0; k < K; ++k) {
      for (std::int64_t n = 0; n < wt.shape[1]; ++n) {
        const std::int64_t col = col0 + n, at = (col / P) * K * P + k * P + col % P;
        const std::int64_t from = k * wt.strides[0] + n;
        if (bf16) {
          dst16[at] = static_cast<const std::uint16_t*>(wt.data)[from];
        } else {
          dst[at] = static_cast<const float*>(wt.data)[from];
        }
      }
    }
    if (!biases.empty() && biases[w]) {
      const auto* b = static_cast<const float*>(biases[w]->data);
      for (std::int64_t n = 0; n < wt.shape[1]; ++n) bias[col0 + n] = b[n * biases[w]->strides[0]];
    }
    col0 += part_width(wt.shape[1]);
  }
  return m;
}

void run_linear_panels(const PackedMatrix& b, const TensorView& x, float* y, std::int64_t y_stride,
                       std::int64_t p_begin, std::int64_t p_end, Context& ctx) {
  GemmProblem g;
  g.a = rows_of(x);
  g.M = rows_count(x);
  g.c.data = y;
  g.c.dims[2] = g.M;
  g.c.strides[2] = y_stride;
  g.b = &b;
  g.p_begin = p_begin;
  g.p_end = p_end;
  run_gemm(g, ctx);
}

}  // namespace detail

Linear Linear::concat(const std::vector<TensorView>& weights,
                      const std::vector<std::optional<TensorView>>& biases) {
  return Linear(detail::pack_parts(weights, biases, false));
}

std::int64_t Linear::in_features() const { return m_->K; }
std::int64_t Linear::out_features() const { return m_->N; }

void Linear::forward(const TensorView& x, const OutputView& y_out, Context* context) const {
  detail::CallScope scope("linear");
  const TensorView y = y_out;
  detail::check_view("x", x, 1, 4);
  detail::check_view("y", y, 1, 4);
  detail::check_dtype("x", x, false);
  detail::check_dtype("y", y, false);
  // Built only to fail with: a call that passes its checks allocates nothing.
  const auto shapes = [&] {
    return "x " + shape_str(x) + ", y " + shape_str(y) + ", weight [" + std::to_string(m_->K) +
           "," + std::to_string(m_->N) + "]";
  };
  if (x.shape[x.rank - 1] != m_->K) {
    fail("x's last dimension must be in_features=" + std::to_string(m_->K) + " (" + shapes() + ")");
  }
  if (y.shape[y.rank - 1] != m_->N) {
    fail("y's last dimension must be out_features=" + std::to_string(m_->N) + " (" + shapes() +
         ")");
  }
  bool same = x.rank == y.rank;
  for (int d = 0; same && d + 1 < x.rank; ++d) same = x.shape[d] == y.shape[d];
  if (!same) fail("x and y must have the same leading dimensions (" + shapes() + ")");
  detail::check_no_self_overlap("y", y);
  detail::check_disjoint("y", detail::extent_of("y", y), {{"x", detail::extent_of("x", x)}});

  detail::GemmProblem g;
  g.a = detail::rows_of(x);
  g.c = detail::rows_of(y);
  g.M = detail::rows_count(x);
  g.b = m_.get();
  Context& ctx = context != nullptr ? *context : default_context();
  scope.set_dtypes(x.dtype, m_->dtype, y.dtype);
  if (scope.active()) {
    scope.record().shapes = "x:" + detail::dims_of(x) + ";weight:" + std::to_string(m_->K) + "x" +
                            std::to_string(m_->N) + ";y:" + detail::dims_of(y);
  }
  detail::run_gemm(g, ctx);
  scope.finish(ctx);
}

}  // namespace cpuattn
