// cpuattn profiling: where the time of each library call goes.
//
// Every library call (attention, Linear::forward, MultiHeadAttention::forward/forward_cross/
// decode, AdditiveAttention::forward, MultiplicativeAttention::forward) can be recorded as one
// CallProfile: what ran (shapes, mask, target, provider, threads, plan), its wall time and work,
// and, when phases are on, how the threads' time splits into phases, measured by timers compiled
// into the kernels (time-stamp counter reads at phase boundaries, per key block).
//
// Recording is off by default and then costs one relaxed atomic load per call. It is switched on
// by any of:
//   CPUATTN_VERBOSE=1   one line per call on stderr (format: verbose_line(), docs/profiling.md)
//   CPUATTN_VERBOSE=2   the same line with the phase split
//   CPUATTN_TRACE=F     a Chrome trace-event file F of every call, its tasks and phases, written
//                       when the process exits normally, or earlier by write_trace()
//   a ProfileSession    collects the CallProfile of every call while it lives
// A call made inside another library call (MultiHeadAttention's projections, say) is part of
// the outer call's record, not a record of its own.
//
// Plain C++20, like cpuattn.h: no SIMD or threading library types.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"

namespace cpuattn {

// Phases a call's thread time is split into. Attention kernels: pack_q (query rows scaled into
// a block, and the row state reset), pack_kv (K/V blocks transposed into panels, prefetch),
// mask (per-row key limits and mask pointers; in decode also the masking of the score row),
// scores (the Q K^T micro-kernel, with its masking epilogue), softmax (the online softmax: max,
// exp2, rescale), pv (P V), output (normalisation and the store of out/lse or of partials),
// merge (the split-key merge). Layers: gemm (Linear's tasks), additive (the additive-attention
// score and context tasks), reference (the double-precision path, when weights are requested).
enum class Phase : std::uint8_t {
  pack_q,
  pack_kv,
  mask,
  scores,
  softmax,
  pv,
  output,
  merge,
  gemm,
  additive,
  reference,
};
inline constexpr int kNumPhases = 11;
CPUATTN_API const char* phase_name(Phase phase);

// One task on one thread, or one phase interval inside a task. Times in microseconds on the
// trace clock (steady clock, zero at the first recorded call of the process).
struct TaskSpan {
  int thread;  // the thread's slot in the call's arena: 0 .. threads - 1
  std::int64_t task;
  double begin_us, end_us;
};
struct PhaseSpan {
  int thread;
  Phase phase;
  double begin_us, end_us;
};

struct CPUATTN_API CallProfile {
  std::string op;      // attention, linear, mha.forward, mha.forward_cross, mha.decode, additive,
                       // multiplicative
  std::string shapes;  // e.g. q:1x16x2048x64;k:1x16x2048x64;v:1x16x2048x64;out:1x16x2048x64
  std::string dtype;   // element type of Q (a layer's input x): f32, bf16, f16
  std::string kv;      // of K and V (a KV cache's storage; a Linear's weight): f32, bf16, f16, int8
  std::string out;     // of the output: f32, bf16, f16
  std::string mask;    // none, or '+'-joined: causal_top_left, causal_bottom_right, bool,
                       // additive, key_lengths
  Target target = Target::scalar;  // the SIMD target and provider the call ran
  Simd simd = Simd::highway;
  int threads = 0;            // threads the call could use (its arena's concurrency)
  std::int64_t tasks = 0;     // tasks of all the call's parallel loops
  std::int64_t k_splits = 1;  // key splits of the attention plan (1: none)
  // The units the attention plan chose (docs/architecture.md, "The path"), e.g.
  // "portable:tiled=tile_f32+tile_f32/f32_stream"; "-" for calls that run no attention kernel.
  std::string path = "-";
  double start_us = 0;      // on the trace clock
  double wall_ms = 0;       // measured by the calling thread, entry to return
  double flops = 0;         // attention: 2 (D + Dv) per visible (query, key) pair per head
  double bytes = 0;         // inputs read once and outputs written once
  bool has_phases = false;  // phase_ms and thread_busy_ms were measured
  std::array<double, kNumPhases> phase_ms{};  // summed over threads
  std::vector<double> thread_busy_ms;         // per thread slot: time inside tasks
  std::vector<TaskSpan> task_spans;           // with spans on (trace, ProfileSession(true))
  std::vector<PhaseSpan> phase_spans;
  std::int64_t dropped_spans = 0;  // spans not kept (2^16 per thread slot per call at most)

  double gflops() const { return wall_ms > 0 ? flops / (wall_ms * 1e6) : 0.0; }
  double gbps() const { return wall_ms > 0 ? bytes / (wall_ms * 1e6) : 0.0; }
  double phase_total_ms() const;
};

// The CPUATTN_VERBOSE line of a call (no newline). Fields in this order, comma-separated:
//   cpuattn_verbose,<op>,dtype=..,kv=..,out=..,shapes=..,mask=..,target=..,simd=..,threads=..,
//   tasks=..,k_splits=..,path=..,time_ms=..,gflops=..,gbps=..
// and with level >= 2 and phases measured: ,phases=<name>:<ms>;<name>:<ms>;... (thread-summed
// ms of the phases that took time, in Phase order).
CPUATTN_API std::string verbose_line(const CallProfile& call, int level);

// The CPUATTN_VERBOSE level this process started with (0 if unset or not a number).
CPUATTN_API int verbose_level();

// Collects the CallProfile of every call made in the process (any thread) while it lives, with
// phases; with spans = true also every task's and phase's interval (for a trace). Sessions may
// overlap; each receives every call.
class CPUATTN_API ProfileSession {
 public:
  explicit ProfileSession(bool spans = false);
  ~ProfileSession();
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;
  // The calls recorded since the session began or since the last take(), oldest first.
  std::vector<CallProfile> take();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes `calls` as a Chrome trace-event JSON file (opens in ui.perfetto.dev and
// chrome://tracing): one track per thread slot plus a "calls" track, one span per call, task
// and phase. Throws Error if the file cannot be written.
CPUATTN_API void write_chrome_trace(const std::vector<CallProfile>& calls, const std::string& path);

// With CPUATTN_TRACE set: writes every call recorded so far to that file now (the file is
// rewritten at exit with everything recorded by then). Returns false when CPUATTN_TRACE is not
// set; throws Error if the file cannot be written.
CPUATTN_API bool write_trace();

}  // namespace cpuattn
