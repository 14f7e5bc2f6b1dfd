// Recording of library calls (include/cpuattn/profile.h): the process-wide switches
// (CPUATTN_VERBOSE, CPUATTN_TRACE, live ProfileSessions), the call scope, the verbose line and
// the Chrome trace writer.
#include "cpuattn/profile.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "api/call_scope.h"
#include "api/checks.h"
#include "api/context_impl.h"
#include "dispatch/dispatch.h"
#include "kv/elem.h"

namespace cpuattn {

struct ProfileSession::Impl {
  bool spans;
  std::vector<CallProfile> calls;
};

namespace detail {
namespace {

enum : unsigned { kOn = 1, kPhases = 2, kSpans = 4 };

// The trace of CPUATTN_TRACE keeps at most this many spans (~128 MiB); later calls keep their
// call span and count the rest as dropped, so a long-running service cannot grow without bound.
constexpr std::size_t kMaxTraceSpans = std::size_t{1} << 22;

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Global {
  int verbose = 0;
  std::string trace_path;
  std::atomic<unsigned> mode{0};
  // Origin of the trace clock, and the tick count there (the long baseline that calibrates the
  // time-stamp counter once calls are 10 ms apart).
  const std::int64_t ns_origin = steady_ns();
  const std::uint64_t tick_origin = ticks();
  std::mutex mu;  // sessions and trace
  std::vector<ProfileSession::Impl*> sessions;
  std::vector<CallProfile> trace;
  std::size_t trace_spans = 0;
  std::mutex print_mu;

  Global() {
    if (const char* v = std::getenv("CPUATTN_VERBOSE"); v != nullptr && *v != '\0') {
      verbose = std::max(0, std::atoi(v));
    }
    if (const char* t = std::getenv("CPUATTN_TRACE"); t != nullptr && *t != '\0') trace_path = t;
    update_mode();
  }
  ~Global() {
    if (trace_path.empty()) return;
    try {
      write_chrome_trace(trace, trace_path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s (CPUATTN_TRACE)\n", e.what());
    }
  }
  // Under mu (or in the constructor).
  void update_mode() {
    unsigned m = 0;
    if (verbose >= 1) m |= kOn;
    if (verbose >= 2) m |= kOn | kPhases;
    if (!trace_path.empty()) m |= kOn | kPhases | kSpans;
    for (const auto* s : sessions) m |= kOn | kPhases | (s->spans ? kSpans : 0u);
    mode.store(m, std::memory_order_relaxed);
  }
};

Global& global() {
  static Global g;
  return g;
}

void emit(Global& g, CallProfile&& r) {
  if (g.verbose >= 1) {
    // One write per line, under a lock: lines from concurrent calls never interleave.
    const std::string line = verbose_line(r, g.verbose) + "\n";
    const std::lock_guard<std::mutex> lock(g.print_mu);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
  const std::lock_guard<std::mutex> lock(g.mu);
  for (auto* s : g.sessions) s->calls.push_back(r);
  if (!g.trace_path.empty()) {
    const std::size_t n = r.task_spans.size() + r.phase_spans.size();
    if (g.trace_spans + n > kMaxTraceSpans) {
      r.dropped_spans += static_cast<std::int64_t>(n);
      r.task_spans.clear();
      r.phase_spans.clear();
    } else {
      g.trace_spans += n;
    }
    g.trace.push_back(std::move(r));
  }
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace

CallScope::CallScope(const char* op) {
  if constexpr (!kInstrumented) return;  // the build the cost of recording is measured against
  Global& g = global();
  const unsigned mode = g.mode.load(std::memory_order_relaxed);
  if (mode == 0 || current_recorder() != nullptr) return;
  profile_ = std::make_unique<CallProfile>();
  rec_ = std::make_unique<Recorder>(*profile_, (mode & kPhases) != 0, (mode & kSpans) != 0);
  profile_->op = op;
  profile_->dtype = profile_->kv = profile_->out = "f32";
  profile_->mask = "none";
  current_ = std::make_unique<CurrentRecorder>(rec_.get());
  ns0_ = steady_ns();
  t0_ = ticks();
}

void CallScope::set_dtypes(DType q, DType kv, DType out) {
  if (!profile_) return;
  // The names the CLI's --dtype and --kv-dtype take.
  const auto name = [](DType t) { return dtype_short_name(t); };
  profile_->dtype = name(q);
  profile_->kv = name(kv);
  profile_->out = name(out);
}

void CallScope::finish(Context& ctx) {
  if (!rec_) return;
  const std::uint64_t t1 = ticks();
  const std::int64_t ns1 = steady_ns();
  current_.reset();
  Global& g = global();
  CallProfile& r = *profile_;
  r.start_us = static_cast<double>(ns0_ - g.ns_origin) * 1e-3;
  r.wall_ms = static_cast<double>(ns1 - ns0_) * 1e-6;
  const Choice ch = choose(&ctx);
  r.target = ch.target;
  r.simd = ch.provider;
  Context::Impl& c = ContextAccess::impl(ctx);
  r.threads = c.arena ? c.arena->max_concurrency() : tbb::this_task_arena::max_concurrency();
  if (rec_->phases()) {
    // Ticks to ns: over the process's life once that is long (accurate to a few ppm), else over
    // this call.
    double ns_per_tick = 1.0;
    if (ns1 - g.ns_origin > 10'000'000 && t1 > g.tick_origin) {
      ns_per_tick =
          static_cast<double>(ns1 - g.ns_origin) / static_cast<double>(t1 - g.tick_origin);
    } else if (t1 > t0_ && ns1 > ns0_) {
      ns_per_tick = static_cast<double>(ns1 - ns0_) / static_cast<double>(t1 - t0_);
    }
    rec_->summarize(t0_, ns_per_tick);
  }
  rec_.reset();
  emit(g, std::move(r));
  profile_.reset();
}

std::string mask_description(const AttentionOptions& opts) {
  std::string m;
  const auto add = [&](const char* s) {
    if (!m.empty()) m += '+';
    m += s;
  };
  if (opts.causal == Causal::top_left) add("causal_top_left");
  if (opts.causal == Causal::bottom_right) add("causal_bottom_right");
  if (opts.mask) add(opts.mask->dtype == DType::boolean ? "bool" : "additive");
  if (opts.key_lengths) add("key_lengths");
  return m.empty() ? "none" : m;
}

std::string dims_of(const TensorView& t) { return join_dims(t, 'x'); }

}  // namespace detail

const char* phase_name(Phase phase) {
  static constexpr const char* kNames[kNumPhases] = {"pack_q",  "pack_kv",  "mask",     "scores",
                                                     "softmax", "pv",       "output",   "merge",
                                                     "gemm",    "additive", "reference"};
  const auto i = static_cast<unsigned>(phase);
  return i < kNumPhases ? kNames[i] : "unknown";
}

double CallProfile::phase_total_ms() const {
  double t = 0;
  for (double p : phase_ms) t += p;
  return t;
}

int verbose_level() { return detail::global().verbose; }

std::string verbose_line(const CallProfile& c, int level) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                ",target=%s,simd=%s,threads=%d,tasks=%" PRId64 ",k_splits=%" PRId64,
                target_name(c.target), simd_name(c.simd), c.threads, c.tasks, c.k_splits);
  std::string line = "cpuattn_verbose," + c.op + ",dtype=" + c.dtype + ",kv=" + c.kv +
                     ",out=" + c.out + ",shapes=" + c.shapes + ",mask=" + c.mask + buf +
                     ",path=" + c.path;
  std::snprintf(buf, sizeof buf, ",time_ms=%.4f,gflops=%.2f,gbps=%.2f", c.wall_ms, c.gflops(),
                c.gbps());
  line += buf;
  if (level >= 2 && c.has_phases) {
    line += ",phases=";
    bool first = true;
    for (int p = 0; p < kNumPhases; ++p) {
      if (c.phase_ms[p] <= 0) continue;
      std::snprintf(buf, sizeof buf, "%s%s:%.4f", first ? "" : ";",
                    phase_name(static_cast<Phase>(p)), c.phase_ms[p]);
      line += buf;
      first = false;
    }
  }
  return line;
}

ProfileSession::ProfileSession(bool spans) : impl_(std::make_unique<Impl>()) {
  impl_->spans = spans;
  detail::Global& g = detail::global();
  const std::lock_guard<std::mutex> lock(g.mu);
  g.sessions.push_back(impl_.get());
  g.update_mode();
}

ProfileSession::~ProfileSession() {
  detail::Global& g = detail::global();
  const std::lock_guard<std::mutex> lock(g.mu);
  g.sessions.erase(std::find(g.sessions.begin(), g.sessions.end(), impl_.get()));
  g.update_mode();
}

std::vector<CallProfile> ProfileSession::take() {
  detail::Global& g = detail::global();
  const std::lock_guard<std::mutex> lock(g.mu);
  std::vector<CallProfile> out;
  out.swap(impl_->calls);
  return out;
}

void write_chrome_trace(const std::vector<CallProfile>& calls, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw Error("cpuattn: cannot write the trace file '" + path + "'");
  // Track 0 holds the calls; thread slot i is track i + 1.
  int slots = 0;
  for (const auto& c : calls) {
    for (const auto& s : c.task_spans) slots = std::max(slots, s.thread + 1);
    for (const auto& s : c.phase_spans) slots = std::max(slots, s.thread + 1);
  }
  char buf[256];
  f << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  f << R"({"ph":"M","pid":1,"tid":0,"name":"process_name","args":{"name":"cpuattn"}})";
  f << ",\n"
    << R"({"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"calls"}})";
  for (int t = 0; t < slots; ++t) {
    f << ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" << t + 1
      << ",\"name\":\"thread_name\",\"args\":{\"name\":\"thread " << t << "\"}}";
    f << ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" << t + 1
      << ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" << t + 1 << "}}";
  }
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const CallProfile& c = calls[i];
    std::snprintf(buf, sizeof buf, "%.3f,\"dur\":%.3f", c.start_us, c.wall_ms * 1e3);
    f << ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":0,\"cat\":\"call\",\"name\":\""
      << detail::json_escape(c.op) << "\",\"ts\":" << buf << ",\"args\":{\"call\":" << i
      << ",\"line\":\"" << detail::json_escape(verbose_line(c, 2))
      << "\",\"dropped_spans\":" << c.dropped_spans << "}}";
    for (const TaskSpan& s : c.task_spans) {
      std::snprintf(buf, sizeof buf, "%.3f,\"dur\":%.3f", s.begin_us, s.end_us - s.begin_us);
      f << ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":" << s.thread + 1
        << ",\"cat\":\"task\",\"name\":\"task\",\"ts\":" << buf << ",\"args\":{\"call\":" << i
        << ",\"task\":" << s.task << "}}";
    }
    for (const PhaseSpan& s : c.phase_spans) {
      std::snprintf(buf, sizeof buf, "%.3f,\"dur\":%.3f", s.begin_us, s.end_us - s.begin_us);
      f << ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":" << s.thread + 1 << ",\"cat\":\"phase\",\"name\":\""
        << phase_name(s.phase) << "\",\"ts\":" << buf << ",\"args\":{\"call\":" << i << "}}";
    }
  }
  f << "\n]}\n";
  f.flush();
  if (!f) throw Error("cpuattn: cannot write the trace file '" + path + "'");
}

bool write_trace() {
  detail::Global& g = detail::global();
  if (g.trace_path.empty()) return false;
  const std::lock_guard<std::mutex> lock(g.mu);
  write_chrome_trace(g.trace, g.trace_path);
  return true;
}

}  // namespace cpuattn
