// What a Context owns: its threads (an arena, or none to use the caller's), its target cap and
// the scratch memory reused across calls.
#pragma once

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/recorder.h"
#include "core/scratch.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn {
namespace detail {
struct Plan;
}  // namespace detail

struct Context::Impl {
  int num_threads = 0;
  std::atomic<Target> max_target{Target::best};
  std::atomic<Simd> simd{Simd::highway};
  std::unique_ptr<tbb::task_arena> arena;  // null: run in the caller's arena
  // Working memory of tasks, per thread that runs them. A task never waits on other tasks, so one
  // thread runs at most one task at a time and its buffer is never shared.
  tbb::enumerable_thread_specific<detail::Scratch> task_scratch;
  // Per calling thread: buffers that live for a whole call (partial results of split keys).
  tbb::enumerable_thread_specific<detail::Scratch> call_scratch;

  // Per calling thread: the intermediate tensors of a layer call (projections, head outputs).
  tbb::enumerable_thread_specific<detail::Scratch> layer_scratch;

  // A thread keeps at most this many bytes in each of its scratch buffers between uses.
  std::atomic<std::size_t> scratch_limit{SIZE_MAX};

  // Benchmarks only (bench/support/tweaks.h): a change applied to every flash plan this context
  // makes, right after plan_flash(), so that `cpuattn bench --tweak` can time a variant of the
  // plan against the shipped one call by call on the same inputs. Null in every other use.
  std::atomic<void (*)(detail::Plan&)> plan_tweak{nullptr};

  // Called by the thread that owns `s` when it is done with it for now: frees it if it is above
  // the limit. Only the owner touches its buffer, so this needs no lock.
  void done_with(detail::Scratch& s) const {
    if (s.bytes() > scratch_limit.load(std::memory_order_relaxed)) s.release();
  }
  // done_with(s) at the end of a scope, also when the scope is left by an exception.
  struct Lease {
    const Impl& impl;
    detail::Scratch& scratch;
    ~Lease() { impl.done_with(scratch); }
  };

  // Runs f() with this context's threads. Isolated: while this thread waits for f's tasks it
  // takes no other task of the arena. Without isolation, a caller's own parallel loop over
  // requests could hand this thread another request's call in the middle of this one, and that
  // call would reuse this thread's call_scratch/layer_scratch under it.
  template <class F>
  void run(F&& f) {
    if (arena) {
      arena->execute([&] { tbb::this_task_arena::isolate(f); });
    } else {
      tbb::this_task_arena::isolate(f);
    }
  }

  // Runs a caller's whole step f() (a layer's projections, attention and output) as ONE entry
  // into the arena: with many callers on one Context a step then waits for the arena once, not
  // once per inner call. f may run on any thread of the arena, and that thread may be waiting
  // inside a call of its own further down its stack (a step handed over by execute() is taken
  // even by an isolated thread), so state that lives across f's waits is the caller's, captured
  // here: its call_scratch (call_scratch_now()) and its profile recorder.
  template <class F>
  void run_for_caller(F&& f) {
    detail::Scratch& call = call_scratch_now();
    detail::Recorder* rec = detail::current_recorder();
    run([&] {
      const CallerScope caller(*this, call);
      const detail::CurrentRecorder current(rec);
      f();
    });
  }

  // The call_scratch of the call running on this thread: the thread's own, or inside
  // run_for_caller() the caller's.
  detail::Scratch& call_scratch_now() {
    const CallerState& state = caller_state();
    return state.owner == this ? *state.call : call_scratch.local();
  }

 private:
  struct CallerState {
    const Impl* owner = nullptr;
    detail::Scratch* call = nullptr;
  };
  static CallerState& caller_state() {
    static thread_local CallerState state;
    return state;
  }
  // Makes `call` this thread's call scratch of `impl` for the life of the object (restored also
  // when f throws).
  struct CallerScope {
    CallerState saved;
    CallerScope(const Impl& impl, detail::Scratch& call) : saved(caller_state()) {
      caller_state() = {&impl, &call};
    }
    ~CallerScope() { caller_state() = saved; }
    CallerScope(const CallerScope&) = delete;
    CallerScope& operator=(const CallerScope&) = delete;
  };
};

namespace detail {
struct ContextAccess {
  static Context::Impl& impl(Context& c) { return *c.impl_; }
};
}  // namespace detail

}  // namespace cpuattn
