// `cpuattn profile`: runs one case several times with the library's phase timers on, and says
// where the time goes: per phase, per thread, against the machine's ceilings (FMA peak, the score
// micro-kernel on L1 data, read bandwidth), with hardware counters when the kernel allows them.
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cases.h"
#include "cli_util.h"
#include "commands.h"
#include "counters.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/profile.h"
#include "machine.h"
#include "probes.h"
#include "tweaks.h"

namespace cpuattn::cli {
namespace {

using Json = nlohmann::ordered_json;

struct Options {
  std::string shape = "P1";
  bool causal = false;
  std::string dtype = "f32", kv_dtype;  // kv_dtype empty: dtype
  int threads = 0;                      // 0: the machine's logical CPUs
  int repeat = 5;
  std::string target = "best";
  std::string simd;
  std::string tweak;  // a plan tweak (bench/support/tweaks.h); empty: the shipped plan
  std::string trace;
  bool json = false;
  std::string layout = "bhld";
};

// The machine's ceilings, the best reading of each over the probes.
struct Ceilings {
  // FMA GFLOP/s, score micro-kernel GFLOP/s, one flash block's GFLOP/s, read GB/s
  double peak = 0, tile = 0, block = 0, bw = 0;
};

// The median call (by wall time), the one described, and what follows from it.
struct Summary {
  const CallProfile* m = nullptr;
  double best_ms = 0, total = 0, capacity = 0;
  int slots = 0;
  double busy_sum = 0, busy_max = 0, busy_mean = 0;
  // Roofline: the time the work would take at each ceiling, against the measured time.
  double gflops = 0, t_fma = 0, t_mem = 0, intensity = 0, balance = 0;
  bool compute_bound = false;
};

Summary summarize(const std::vector<CallProfile>& calls, const Ceilings& ce) {
  std::vector<std::size_t> order(calls.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return calls[a].wall_ms < calls[b].wall_ms; });
  Summary s;
  s.m = &calls[order[order.size() / 2]];
  const CallProfile& m = *s.m;
  s.best_ms = calls[order.front()].wall_ms;
  s.total = m.phase_total_ms();
  s.capacity = m.wall_ms * m.threads;
  s.slots = m.threads;
  for (int t = 0; t < s.slots && t < static_cast<int>(m.thread_busy_ms.size()); ++t) {
    s.busy_sum += m.thread_busy_ms[t];
    s.busy_max = std::max(s.busy_max, m.thread_busy_ms[t]);
  }
  s.busy_mean = s.busy_sum / s.slots;
  s.gflops = m.gflops();
  s.t_fma = m.flops / (ce.peak * 1e9) * 1e3;  // ms
  s.t_mem = m.bytes / (ce.bw * 1e9) * 1e3;
  s.intensity = m.bytes > 0 ? m.flops / m.bytes : 0;
  s.balance = ce.peak / ce.bw;
  s.compute_bound = s.t_fma >= s.t_mem;
  return s;
}

// The fused loop's phases against the flash-block probe, and the work outside the loop: for f32
// attention that is compute-bound, the problem the probe runs (bf16 products and decoding's
// streamed blocks have other ceilings). Thread time, as the phases are.
struct LoopSplit {
  bool shown = false;
  double loop_ms = 0, at_block_ms = 0, outside_ms = 0;
};

LoopSplit loop_split(const Summary& s, const Ceilings& ce) {
  const CallProfile& m = *s.m;
  const auto ms = [&](Phase p) { return m.phase_ms[static_cast<int>(p)]; };
  LoopSplit l;
  l.loop_ms = ms(Phase::scores) + ms(Phase::softmax) + ms(Phase::pv);
  l.shown = m.op == "attention" && m.dtype == "f32" && m.kv == "f32" && s.compute_bound &&
            l.loop_ms > 0 && ce.block > 0;
  l.at_block_ms = m.flops / (ce.block * 1e9 / m.threads) * 1e3;
  l.outside_ms = ms(Phase::pack_q) + ms(Phase::pack_kv) + ms(Phase::mask) + ms(Phase::output) +
                 ms(Phase::merge);
  return l;
}

Json profile_json(const Options& o, const Case& c, const Summary& s, const Ceilings& ce,
                  const ThreadCounters& counters, const std::vector<ThreadCounters::Value>& hw) {
  const CallProfile& m = *s.m;
  Json j;
  j["op"] = m.op;
  j["shape"] = c.name;
  j["dims"] = c.dims;
  j["shapes"] = m.shapes;
  j["mask"] = m.mask;
  j["dtype"] = m.dtype;
  j["kv"] = m.kv;
  j["out"] = m.out;
  j["target"] = target_name(m.target);
  j["simd"] = simd_name(m.simd);
  j["threads"] = m.threads;
  j["tasks"] = m.tasks;
  j["k_splits"] = m.k_splits;
  j["path"] = m.path;
  if (!o.tweak.empty()) j["tweak"] = o.tweak;
  j["repeat"] = o.repeat;
  j["median_ms"] = m.wall_ms;
  j["best_ms"] = s.best_ms;
  j["gflops"] = s.gflops;
  j["gbps"] = m.gbps();
  Json ph = Json::object();
  for (int p = 0; p < kNumPhases; ++p) {
    if (m.phase_ms[p] <= 0) continue;
    ph[phase_name(static_cast<Phase>(p))] = {
        {"ms", m.phase_ms[p]}, {"share", s.total > 0 ? m.phase_ms[p] / s.total : 0.0}};
  }
  j["phases"] = ph;
  j["phase_total_ms"] = s.total;
  j["wall_x_threads_ms"] = s.capacity;
  j["thread_busy_ms"] = std::vector<double>(
      m.thread_busy_ms.begin(),
      m.thread_busy_ms.begin() + std::min<std::size_t>(s.slots, m.thread_busy_ms.size()));
  j["imbalance"] = s.busy_mean > 0 ? s.busy_max / s.busy_mean : 0.0;
  j["roofline"] = {{"fma_peak_gflops", ce.peak},
                   {"tile_gflops", ce.tile},
                   {"read_gbps", ce.bw},
                   {"pct_fma_peak", 100 * s.gflops / ce.peak},
                   {"pct_tile", 100 * s.gflops / ce.tile},
                   {"block_gflops", ce.block},
                   {"pct_block", 100 * s.gflops / ce.block},
                   {"bytes", m.bytes},
                   {"pct_read_bw", 100 * m.gbps() / ce.bw},
                   {"flop_per_byte", s.intensity},
                   {"machine_balance", s.balance},
                   {"bound", s.compute_bound ? "compute" : "memory"}};
  if (const LoopSplit l = loop_split(s, ce); l.shown) {
    j["roofline"]["loop_ms"] = l.loop_ms;
    j["roofline"]["loop_at_block_ms"] = l.at_block_ms;
    j["roofline"]["outside_loop_ms"] = l.outside_ms;
  }
  Json cj = Json::object();
  for (const auto& v : hw) cj[v.name] = v.value;
  j["counters"] = cj;
  if (!counters.hardware_unavailable().empty())
    j["hardware_counters_unavailable"] = counters.hardware_unavailable();
  const Machine& mach = this_machine();
  j["machine"] = machine_json();
  j["version"] = mach.version;
  j["revision"] = mach.revision;
  if (!o.trace.empty()) j["trace"] = o.trace;
  return j;
}

// The header, the phases of the median call and the threads' busy time.
void print_phases(const Options& o, const Case& c, const Summary& s) {
  const CallProfile& m = *s.m;
  const Machine& mach = this_machine();
  std::printf(
      "cpuattn profile: %s %s (%s), mask %s, Q %s, K/V %s, out %s, target %s, simd %s, "
      "%d thread%s\n",
      c.name.c_str(), c.dims.c_str(), m.op.c_str(), m.mask.c_str(), m.dtype.c_str(), m.kv.c_str(),
      m.out.c_str(), target_name(m.target), simd_name(m.simd), m.threads, m.threads > 1 ? "s" : "");
  if (!o.tweak.empty()) std::printf("plan tweak: %s\n", o.tweak.c_str());
  std::printf("machine: %s, %d logical CPUs, L1d %lld KiB, L2 %lld KiB; cpuattn %s (%s)\n",
              mach.cpu.c_str(), mach.logical_cpus, static_cast<long long>(mach.l1d_bytes / 1024),
              static_cast<long long>(mach.l2_bytes / 1024), mach.version.c_str(),
              mach.revision.c_str());
  std::printf(
      "%d calls: median %.3f ms (best %.3f), %.1f GFLOP/s; plan: %lld tasks, %lld key "
      "split%s, path %s\n\n",
      o.repeat, m.wall_ms, s.best_ms, s.gflops, static_cast<long long>(m.tasks),
      static_cast<long long>(m.k_splits), m.k_splits > 1 ? "s" : "", m.path.c_str());
  std::printf("Phases of the median call (thread time, summed over threads):\n");
  std::printf("  %-10s %10s %7s\n", "phase", "ms", "share");
  for (int p = 0; p < kNumPhases; ++p) {
    if (m.phase_ms[p] <= 0) continue;
    std::printf("  %-10s %10.3f %6.1f%%\n", phase_name(static_cast<Phase>(p)), m.phase_ms[p],
                100 * m.phase_ms[p] / s.total);
  }
  std::printf(
      "  %-10s %10.3f  = %.1f%% of wall x threads (%.3f ms); the rest is idle time,\n"
      "  scheduling and the work outside tasks (validation, planning)\n\n",
      "total", s.total, 100 * s.total / s.capacity, s.capacity);
  std::printf("Threads: busy ms per thread:");
  for (int t = 0; t < s.slots && t < static_cast<int>(m.thread_busy_ms.size()); ++t)
    std::printf(" %.3f", m.thread_busy_ms[t]);
  std::printf("\n  imbalance (max / mean busy) %.3f; idle %.1f%% of wall x threads\n\n",
              s.busy_mean > 0 ? s.busy_max / s.busy_mean : 0.0,
              100 * (1 - s.busy_sum / s.capacity));
}

// The roofline, the counters and where the trace went.
void print_ceilings(const Options& o, const Summary& s, const Ceilings& ce, int threads,
                    const ThreadCounters& counters, const std::vector<ThreadCounters::Value>& hw) {
  const CallProfile& m = *s.m;
  std::printf("Roofline (%d thread%s):\n", threads, threads > 1 ? "s" : "");
  std::printf(
      "  compute: %.1f GFLOP/s = %.1f%% of the FMA peak (%.1f), %.1f%% of the score\n"
      "           micro-kernel on L1 data (%.1f, the kernel's arithmetic ceiling), %.1f%% of\n"
      "           one flash block on cached data (%.1f, the fused loop's ceiling with its\n"
      "           softmax)\n",
      s.gflops, 100 * s.gflops / ce.peak, ce.peak, 100 * s.gflops / ce.tile, ce.tile,
      100 * s.gflops / ce.block, ce.block);
  if (const LoopSplit l = loop_split(s, ce); l.shown) {
    std::printf(
        "  loop:    scores, softmax and P V take %.3f ms of thread time, against %.3f ms at the\n"
        "           block probe's speed (%.1f%% of it); packing, masks and the output %.3f ms\n",
        l.loop_ms, l.at_block_ms, 100 * l.at_block_ms / l.loop_ms, l.outside_ms);
  }
  std::printf("  memory:  %.1f MB in + out once = %.2f GB/s, %.1f%% of the read bandwidth (%.1f)\n",
              m.bytes * 1e-6, m.gbps(), 100 * m.gbps() / ce.bw, ce.bw);
  std::printf(
      "  %.1f flop/byte against a machine balance of %.1f: %s-bound; at the ceilings the\n"
      "  work takes %.3f ms of FMAs and %.3f ms of memory traffic (measured %.3f)\n\n",
      s.intensity, s.balance, s.compute_bound ? "compute" : "memory", s.t_fma, s.t_mem, m.wall_ms);
  std::printf("Counters (all threads, the %d calls):\n", o.repeat);
  if (!counters.hardware_unavailable().empty()) {
    std::printf(
        "  hardware counters are unavailable here: %s.\n"
        "  The kernel or hypervisor exposes no PMU to this process, as in most VMs.\n",
        counters.hardware_unavailable().c_str());
  }
  double cycles = 0, instr = 0;
  for (const auto& v : hw) {
    std::printf("  %-18s %.0f\n", v.name.c_str(), v.value);
    if (v.name == "cycles") cycles = v.value;
    if (v.name == "instructions") instr = v.value;
  }
  if (cycles > 0) std::printf("  %-18s %.2f\n", "IPC", instr / cycles);
  if (hw.empty() && !counters.software_unavailable().empty()) {
    std::printf("  software counters are unavailable too (%s)\n",
                counters.software_unavailable().c_str());
  }
  if (!o.trace.empty()) {
    std::printf("\nTrace of the %d calls: %s (open in ui.perfetto.dev or chrome://tracing)\n",
                o.repeat, o.trace.c_str());
  }
}

int run_profile(const Options& o) {
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const DType qd = parse_dtype(o.dtype, "--dtype", false);
  const DType kvd = o.kv_dtype.empty() ? qd : parse_dtype(o.kv_dtype, "--kv-dtype", true);
  const Case c = make_case(o.shape, o.causal, qd, kvd, ScoreVariant::plain, parse_layout(o.layout));
  // The case runs in this arena on a context that uses the caller's arena, so that the counters'
  // observer sees every thread that runs it.
  tbb::task_arena arena(threads);
  ThreadCounters counters(arena);
  Context ctx(0);
  ctx.set_max_target(parse_target(o.target));
  if (!o.simd.empty()) ctx.set_simd(parse_simd(o.simd));
  if (!o.tweak.empty()) set_plan_tweak(ctx, o.tweak);
  const auto once = [&] { arena.execute([&] { c.run(ctx); }); };

  // The ceilings are measured before and after the calls and the best reading of each is kept,
  // as in `cpuattn bench`: a neighbour on a shared core during one probe would lower it.
  Context probe_ctx(threads);
  probe_ctx.set_max_target(ctx.max_target());
  probe_ctx.set_simd(ctx.simd());
  Ceilings ce;
  const auto probe = [&] {
    ce.peak = std::max(ce.peak, measure_fma_peak_gflops(threads, &probe_ctx));
    ce.tile = std::max(ce.tile, measure_tile_gflops(threads, &probe_ctx));
    ce.block = std::max(ce.block, measure_block_gflops(threads, &probe_ctx));
    ce.bw = std::max(ce.bw, measure_read_bandwidth_gbps(threads, std::size_t{1} << 30, &probe_ctx));
  };
  probe();

  once();  // warm-up: scratch, page faults, thread start
  std::vector<CallProfile> calls;
  {
    ProfileSession session(/*spans=*/!o.trace.empty());
    counters.enable();
    for (int r = 0; r < o.repeat; ++r) once();
    counters.disable();
    calls = session.take();
  }
  if (calls.empty()) throw std::runtime_error("no call was recorded");
  probe();
  if (!o.trace.empty()) write_chrome_trace(calls, o.trace);

  const Summary s = summarize(calls, ce);
  const auto hw = counters.read();
  if (o.json) {
    std::printf("%s\n", profile_json(o, c, s, ce, counters, hw).dump().c_str());
    return 0;
  }
  print_phases(o, c, s);
  print_ceilings(o, s, ce, threads, counters, hw);
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Run one case --repeat times with the library's phase timers on and report where the\n"
      "median call's time goes: per phase (pack_q, pack_kv, mask, scores, softmax, pv, output,\n"
      "merge; gemm for layers), per thread (busy time, imbalance), against the machine's\n"
      "ceilings (FMA peak, the score micro-kernel on L1 data, read bandwidth: which one binds),\n"
      "and hardware counters (cycles, instructions, IPC, cache misses) where perf_event_open\n"
      "allows them. --trace writes a Chrome trace of the calls: one track per thread, one span\n"
      "per call, task and phase (ui.perfetto.dev, chrome://tracing).\n"
      "Examples:\n"
      "  cpuattn profile --shape P1 --threads 2\n"
      "  cpuattn profile --shape 1,8,4096,4096,64 --causal --trace p.json\n"
      "  cpuattn profile --shape D2 --json");
  cmd->add_option("--dtype", opts->dtype, "Q (and out) dtype: f32, bf16, f16 (default f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--kv-dtype", opts->kv_dtype,
                  "K/V dtype: " + dtype_choices(true) + " (default: --dtype)")
      ->check(CLI::IsMember(dtype_names(true)));
  cmd->add_option("--shape", opts->shape,
                  "Named shape (S1, P1, P2, X1, D1, D2, L1, M1, M2) or B,H,Lq,Lk,D[,Hkv[,Dv]] "
                  "(default P1)");
  cmd->add_flag("--causal", opts->causal, "Make the shape causal (top-left)");
  cmd->add_option("--layout", opts->layout,
                  "Memory layout of an attention shape's Q, K, V and out: bhld ([B, H, L, D], the "
                  "default) or blhd ([B, L, H, D])")
      ->check(CLI::IsMember({"bhld", "blhd"}));
  cmd->add_option("--threads", opts->threads, "Threads (default: the machine's logical CPUs)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", opts->repeat, "Profiled calls after one warm-up (default 5)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--target", opts->target, "Cap the SIMD target: " + target_cap_list())
      ->check(CLI::IsMember(target_cap_names()));
  cmd->add_option("--simd", opts->simd, "SIMD provider: highway or xsimd (default: CPUATTN_SIMD)")
      ->check(CLI::IsMember({"highway", "xsimd"}));
  cmd->add_option("--tweak", opts->tweak,
                  "Run the calls with a plan tweak, as `cpuattn bench --tweak` times it: " +
                      plan_tweak_list())
      ->check(CLI::IsMember(plan_tweak_names()));
  cmd->add_option("--trace", opts->trace, "Write a Chrome trace-event JSON file of the calls");
  cmd->add_flag("--json", opts->json, "One JSON object instead of the report");
  cmd->callback([opts, &exit_code] {
    try {
      exit_code = run_profile(*opts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cpuattn: %s\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace cpuattn::cli
