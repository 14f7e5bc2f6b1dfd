#include "core/recorder.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <mutex>

namespace cpuattn::detail {

namespace {
thread_local Recorder* t_current = nullptr;
// Spans one thread slot keeps per call (2^16 * 32 bytes = 2 MiB): room for a P1-sized call's
// spans (docs/performance.md#dm-spans-per-slot).
constexpr std::size_t kMaxSpansPerSlot = std::size_t{1} << 16;
std::mutex g_slot_mutex;
}  // namespace

std::uint64_t steady_ticks() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

void ThreadLog::keep(const RawSpan& s) {
  if (spans.size() < max_spans_) {
    spans.push_back(s);
  } else {
    ++dropped;
  }
}

void ThreadLog::phase(Phase ph, std::uint64_t begin, std::uint64_t end) {
  phase_ticks[static_cast<int>(ph)] += end - begin;
  if (max_spans_ != 0) {
    // Consecutive laps of one phase (a phase split by a lap of nothing) make one span.
    if (!spans.empty() && spans.back().phase == static_cast<std::int32_t>(ph) &&
        spans.back().end == begin) {
      spans.back().end = end;
    } else {
      keep({begin, end, -1, static_cast<std::int32_t>(ph)});
    }
  }
}

void ThreadLog::task(std::int64_t t, std::uint64_t begin, std::uint64_t end) {
  busy_ticks += end - begin;
  if (max_spans_ != 0) keep({begin, end, t, -1});
}

Recorder::Recorder(CallProfile& out, bool phases, bool spans)
    : out_(out), phases_(phases), spans_(spans) {}

Recorder::~Recorder() {
  for (auto& s : slots_) delete s.load(std::memory_order_relaxed);
}

ThreadLog* Recorder::log() {
  if (!phases_) return nullptr;
  const int idx = std::max(0, tbb::this_task_arena::current_thread_index());
  if (idx >= kMaxSlots) return nullptr;
  ThreadLog* l = slots_[idx].load(std::memory_order_acquire);
  if (l == nullptr) {
    // First task of this slot in the call: one allocation, under a lock shared by all calls
    // (only when recording).
    const std::lock_guard<std::mutex> lock(g_slot_mutex);
    l = slots_[idx].load(std::memory_order_relaxed);
    if (l == nullptr) {
      l = new ThreadLog(spans_ ? kMaxSpansPerSlot : 0);
      slots_[idx].store(l, std::memory_order_release);
    }
  }
  return l;
}

void Recorder::summarize(std::uint64_t t0, double ns_per_tick) {
  CallProfile& out = out_;
  const auto ms = [&](std::uint64_t t) { return static_cast<double>(t) * ns_per_tick * 1e-6; };
  const auto us = [&](std::uint64_t t) {
    return out.start_us + (static_cast<double>(t) - static_cast<double>(t0)) * ns_per_tick * 1e-3;
  };
  out.has_phases = true;
  int used = 0;
  for (int i = 0; i < kMaxSlots; ++i) {
    if (slots_[i].load(std::memory_order_acquire) != nullptr) used = i + 1;
  }
  out.thread_busy_ms.assign(static_cast<std::size_t>(std::max(used, out.threads)), 0.0);
  for (int i = 0; i < used; ++i) {
    const ThreadLog* l = slots_[i].load(std::memory_order_acquire);
    if (l == nullptr) continue;
    for (int p = 0; p < kNumPhases; ++p) out.phase_ms[p] += ms(l->phase_ticks[p]);
    out.thread_busy_ms[i] = ms(l->busy_ticks);
    out.dropped_spans += l->dropped;
    for (const RawSpan& s : l->spans) {
      if (s.phase < 0) {
        out.task_spans.push_back({i, s.task, us(s.begin), us(s.end)});
      } else {
        out.phase_spans.push_back({i, static_cast<Phase>(s.phase), us(s.begin), us(s.end)});
      }
    }
  }
}

Recorder* current_recorder() { return t_current; }

CurrentRecorder::CurrentRecorder(Recorder* rec) : previous_(t_current) { t_current = rec; }
CurrentRecorder::~CurrentRecorder() { t_current = previous_; }

}  // namespace cpuattn::detail
