// The threaded loop of the layers' element-wise passes (positional encodings, QK-norm and RoPE):
// items [0, items) in chunks, each chunk with the calling task's scratch.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "api/context_impl.h"

namespace cpuattn::detail {

// Below this much work (in element updates) a call runs serially in the calling thread: starting
// tasks would cost more than it saves. Tasks get at least kItemsTaskWork each.
inline constexpr double kItemsParallelWork = 32768;
inline constexpr double kItemsTaskWork = 8192;

// Runs body(begin, end, scratch) over the items [0, items), in parallel when there is enough work.
template <class Body>
void for_items(Context* context, std::int64_t items, double work_per_item, const Body& body) {
  Context& ctx = context != nullptr ? *context : default_context();
  Context::Impl& c = ContextAccess::impl(ctx);
  if (static_cast<double>(items) * work_per_item <= kItemsParallelWork) {
    Scratch& s = c.task_scratch.local();
    const Context::Impl::Lease lease{c, s};
    body(std::int64_t{0}, items, s);
    return;
  }
  const auto grain = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(kItemsTaskWork / work_per_item)));
  c.run([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, items, grain),
                      [&](const tbb::blocked_range<std::int64_t>& r) {
                        Scratch& s = c.task_scratch.local();
                        const Context::Impl::Lease lease{c, s};
                        body(r.begin(), r.end(), s);
                      });
  });
}

}  // namespace cpuattn::detail
