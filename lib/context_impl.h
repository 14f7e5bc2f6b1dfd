// What a Context owns: its threads (an arena, or none to use the caller's), its target cap and
// the scratch memory reused across calls.
#pragma once

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <memory>

#include "cpuattn/cpuattn.h"
#include "kernel.h"

namespace cpuattn {

struct Context::Impl {
  int num_threads = 0;
  std::atomic<Target> max_target{Target::best};
  std::unique_ptr<tbb::task_arena> arena;  // null: run in the caller's arena
  // Working memory of tasks, per thread that runs them. A task never waits on other tasks, so one
  // thread runs at most one task at a time and its buffer is never shared.
  tbb::enumerable_thread_specific<detail::Scratch> task_scratch;
  // Per calling thread: buffers that live for a whole call (partial results of split keys).
  tbb::enumerable_thread_specific<detail::Scratch> call_scratch;

  // Runs f() with this context's threads.
  template <class F>
  void run(F&& f) {
    if (arena) {
      arena->execute(f);
    } else {
      f();
    }
  }
};

Context& default_context();

namespace detail {
struct ContextAccess {
  static Context::Impl& impl(Context& c) { return *c.impl_; }
};
}  // namespace detail

}  // namespace cpuattn
