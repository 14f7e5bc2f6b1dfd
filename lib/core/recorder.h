// Per-call instrumentation (include/cpuattn/profile.h): the scope every public entry opens, the
// recorder of the outermost call on a thread, and the clocks the drivers and kernels use.
//
// Cost when recording is off: CallScope reads one atomic; a driver reads one thread-local
// pointer per call; a kernel's PhaseClock holds a null log and each lap() is a predicted branch
// per key block. Built with -DCPUATTN_INSTRUMENT=0, PhaseClock and TaskTimer compile to nothing,
// which is the build the "off costs nothing" measurement compares against (docs/profiling.md).
//
// Kernel units include this header (for PhaseClock); everything here that they use is always
// inlined or defined out of line in recorder.cpp, so the per-architecture xsimd objects emit no
// copy of it (tests/unit_odr_check.sh).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/inline.h"
#include "cpuattn/profile.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#ifndef CPUATTN_INSTRUMENT
#define CPUATTN_INSTRUMENT 1
#endif

namespace cpuattn::detail {

inline constexpr bool kInstrumented = CPUATTN_INSTRUMENT != 0;

// A constant-rate counter where there is one: the x86 time-stamp counter (a read costs a few tens
// of cycles, docs/performance.md#dm-tsc-read-cost) or ARMv8's virtual counter CNTVCT_EL0 (readable
// from user space on Linux; a lower rate, tens of MHz, still far finer than a task). Its rate is
// calibrated against the steady clock over each call. Else the steady clock in ns.
std::uint64_t steady_ticks();
CPUATTN_ALWAYS_INLINE std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#elif defined(__aarch64__)
  std::uint64_t t;
  asm volatile("mrs %0, cntvct_el0" : "=r"(t));
  return t;
#else
  return steady_ticks();
#endif
}

struct RawSpan {
  std::uint64_t begin, end;
  std::int64_t task;   // task spans
  std::int32_t phase;  // -1: a task span, else a Phase
};

// What one thread slot of a call's arena measured. Only the thread holding the slot writes it.
class ThreadLog {
 public:
  explicit ThreadLog(std::size_t max_spans) : max_spans_(max_spans) {}
  void phase(Phase ph, std::uint64_t begin, std::uint64_t end);
  void task(std::int64_t t, std::uint64_t begin, std::uint64_t end);

  std::array<std::uint64_t, kNumPhases> phase_ticks{};
  std::uint64_t busy_ticks = 0;
  std::vector<RawSpan> spans;
  std::int64_t dropped = 0;

 private:
  void keep(const RawSpan& s);
  std::size_t max_spans_;  // 0: spans off
};

// Splits a task's time into phases: each lap() charges the time since the previous lap (or the
// start) to a phase, so the phases of a task add up to the task.
class PhaseClock {
 public:
  CPUATTN_ALWAYS_INLINE explicit PhaseClock(ThreadLog* log) : log_(kInstrumented ? log : nullptr) {
    if (log_ != nullptr) t_ = ticks();
  }
  CPUATTN_ALWAYS_INLINE void lap(Phase ph) {
    if (log_ != nullptr) {
      const std::uint64_t t = ticks();
      log_->phase(ph, t_, t);
      t_ = t;
    }
  }

 private:
  ThreadLog* log_;
  std::uint64_t t_ = 0;
};

// The record of the outermost library call running on the calling thread.
class Recorder {
 public:
  // Drivers add the call's work and plan to `out`; with `phases` they and the kernels time tasks
  // and phases, and with `spans` keep every interval too (summarize() adds those to `out`).
  Recorder(CallProfile& out, bool phases, bool spans);
  ~Recorder();
  // The log of the calling thread's slot in its current arena; null when phases are off (and
  // past kMaxSlots slots).
  ThreadLog* log();
  void add_work(double flops, double bytes) {
    out_.flops += flops;
    out_.bytes += bytes;
  }
  void add_tasks(std::int64_t n) { out_.tasks += n; }
  void set_k_splits(std::int64_t k) { out_.k_splits = k > out_.k_splits ? k : out_.k_splits; }
  // The attention plan's path (a layer that runs attention twice keeps the first).
  void set_path(const std::string& path) {
    if (out_.path == "-") out_.path = path;
  }

  static constexpr int kMaxSlots = 256;
  // Adds up the slots' logs into the record (phase_ms, thread_busy_ms, spans), converting ticks
  // with the given rate and origin (ticks t0 is the record's start_us on the trace clock).
  void summarize(std::uint64_t t0, double ns_per_tick);
  bool phases() const { return phases_; }

 private:
  CallProfile& out_;
  bool phases_, spans_;
  std::array<std::atomic<ThreadLog*>, kMaxSlots> slots_{};
};

// The recorder of the call the calling thread is in, or null (not recording, or no call).
Recorder* current_recorder();

// Times one task of a parallel loop on the calling thread's slot; with a phase, the whole task
// is charged to it (drivers whose kernels have no phase clock of their own).
class TaskTimer {
 public:
  CPUATTN_ALWAYS_INLINE TaskTimer(Recorder* rec, std::int64_t task) : TaskTimer(rec, task, -1) {}
  CPUATTN_ALWAYS_INLINE TaskTimer(Recorder* rec, std::int64_t task, Phase whole)
      : TaskTimer(rec, task, static_cast<int>(whole)) {}
  CPUATTN_ALWAYS_INLINE ~TaskTimer() {
    if (log_ != nullptr) {
      const std::uint64_t t1 = ticks();
      if (phase_ >= 0) log_->phase(static_cast<Phase>(phase_), t0_, t1);
      log_->task(task_, t0_, t1);
    }
  }
  TaskTimer(const TaskTimer&) = delete;
  TaskTimer& operator=(const TaskTimer&) = delete;
  ThreadLog* log() const { return log_; }

 private:
  CPUATTN_ALWAYS_INLINE TaskTimer(Recorder* rec, std::int64_t task, int phase)
      : log_(kInstrumented && rec != nullptr ? rec->log() : nullptr), task_(task), phase_(phase) {
    if (log_ != nullptr) t0_ = ticks();
  }
  ThreadLog* log_;
  std::int64_t task_;
  int phase_;
  std::uint64_t t0_ = 0;
};

// Makes `rec` the calling thread's current recorder for the life of the object.
class CurrentRecorder {
 public:
  explicit CurrentRecorder(Recorder* rec);
  ~CurrentRecorder();
  CurrentRecorder(const CurrentRecorder&) = delete;
  CurrentRecorder& operator=(const CurrentRecorder&) = delete;

 private:
  Recorder* previous_;
};

}  // namespace cpuattn::detail
