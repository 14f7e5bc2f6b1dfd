// The second half of split-key attention (decode with long caches): each split's task left its
// rows' (m, l, unnormalized acc); rescale them to the common max and normalize once.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtypes.h"
#include "core/recorder.h"
#include "core/softmax.h"
#include "kernels/flash/flash.h"

namespace cpuattn::detail {

void merge_partials(const Problem& p, const Plan& pl, Recorder* rec) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, p.B * p.H * p.Lq, 64),
      [&](const tbb::blocked_range<std::int64_t>& range) {
        const TaskTimer timer(rec, range.begin() / 64, Phase::merge);
        std::vector<float> row_buf(p.out_dtype == DType::f32 ? 0 : static_cast<std::size_t>(p.Dv));
        for (std::int64_t row = range.begin(); row < range.end(); ++row) {
          const std::int64_t i = row % p.Lq, h = (row / p.Lq) % p.H, b = row / (p.Lq * p.H);
          RowState st{neg_inf, 0.0f, static_cast<float>(p.sink(h) * kLog2e)};
          for (std::int64_t s = 0; s < pl.k_splits; ++s) {
            const float m = partial_row(p, pl, b, h, i, s)[0];
            // NaN poisons the row, as in the reference; std::max would drop it.
            st.m = std::isnan(m) || std::isnan(st.m) ? std::numeric_limits<float>::quiet_NaN()
                                                     : std::max(st.m, m);
          }
          // Accumulated in f32 here, then stored in out's dtype (f32 rows directly).
          const std::int64_t out_off = b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
          float* dst =
              p.out_dtype == DType::f32 ? static_cast<float*>(p.out) + out_off : row_buf.data();
          std::fill(dst, dst + p.Dv, 0.0f);
          if (!st.empty()) {
            for (std::int64_t s = 0; s < pl.k_splits; ++s) {
              const float* src = partial_row(p, pl, b, h, i, s);
              if (src[0] == neg_inf) continue;
              const float w = std::exp2(src[0] - st.m);
              // A split whose keys all weigh 0 against the row's max adds nothing, whatever its
              // accumulator holds (NaN or inf from a V row that weighed something within the
              // split): as the reference skips keys of weight 0. A NaN sum (a NaN score) still
              // poisons the row.
              if (w == 0.0f && !std::isnan(src[1])) continue;
              st.l += src[1] * w;
              for (std::int64_t d = 0; d < p.Dv; ++d) dst[d] += src[2 + d] * w;
            }
            const float scale = st.out_scale();
            for (std::int64_t d = 0; d < p.Dv; ++d) dst[d] *= scale;
          }
          if (p.out_dtype != DType::f32) {
            for (std::int64_t d = 0; d < p.Dv; ++d)
              store_float(p.out, p.out_dtype, out_off + d, dst[d]);
          }
          if (p.lse) {
            static_cast<float*>(p.lse)[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] = st.lse();
          }
        }
      });
}

}  // namespace cpuattn::detail
