// `cpuattn bench`: times the fused kernel on named or custom shapes, or sweeps threads, sequence
// length or batch, and puts each figure in proportion to this machine's FMA peak and read
// bandwidth, measured before and after the cases. Every record names the machine and build.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cases.h"
#include "cli_util.h"
#include "commands.h"
#include "cpuattn/cpuattn.h"
#include "machine.h"
#include "probes.h"
#include "tweaks.h"

namespace cpuattn::cli {
namespace {

using Json = nlohmann::ordered_json;

struct Options {
  std::vector<std::string> shapes;
  bool causal = false;
  std::vector<int> threads = {1, 2};
  bool threads_given = false;
  std::vector<std::string> targets = {"best"};
  std::vector<std::string> simd;    // empty: the default context's provider (CPUATTN_SIMD)
  std::vector<std::string> tweaks;  // plan tweaks (bench/support/tweaks.h); empty: none
  int repeat = 7;
  bool repeat_given = false;
  std::string sweep;  // "", threads, seq, batch
  std::vector<std::int64_t> values;
  bool json = false, csv = false, md = false;
  std::string out;
  std::vector<std::string> dtypes = {"f32"};      // Q (and out) dtypes
  std::vector<std::string> kv_dtypes;             // K/V dtypes; empty: each Q dtype
  std::vector<std::string> variants = {"plain"};  // score variants (cases.h)
  std::string layout = "bhld";                    // attention shapes' memory layout (cases.h)
  bool cold = false;        // every timed call starts with its inputs out of the caches (Flusher)
  bool huge_pages = false;  // the cases' buffers on 2 MiB pages (set_huge_page_buffers)
  bool read_4k = false;     // the read probe on 4 KiB pages as well (ProbePages::small)
};

// One measured configuration: a case at a thread count, with the sweep value that made it.
struct Point {
  std::string case_name;  // a name for make_case(), or "" with `shape` set
  Shape shape{};
  bool custom = false;
  int threads = 1;
  std::int64_t value = 0;  // the swept value (threads, L or B); 0 without a sweep
};

struct Variant {
  Target cap;
  Simd simd;
  std::string tweak = "none";
};

// A dtype pair: Q and out in `q`, K and V in `kv`; and the score variant of the case.
struct DtypePair {
  DType q, kv;
  ScoreVariant variant = ScoreVariant::plain;
};

Shape with_seq(Shape s, std::int64_t L) {
  // A decode shape keeps one query and sweeps the cache; others sweep Lq = Lk.
  if (s.Lq != 1) s.Lq = L;
  s.Lk = L;
  return s;
}

std::vector<Point> make_points(const Options& o) {
  std::vector<Point> pts;
  if (o.sweep.empty()) {
    std::vector<std::string> names = o.shapes;
    if (names.empty()) names = {"S1", "P1", "P2", "X1", "D1", "D2", "L1", "M1", "M2"};
    for (const auto& n : names)
      for (int t : o.threads) pts.push_back({n, {}, false, t, 0});
    return pts;
  }
  const auto base_name = [&](const char* dflt) {
    return o.shapes.empty() ? std::string(dflt) : o.shapes.front();
  };
  if (o.sweep == "threads") {
    std::vector<int> ts = o.threads;
    if (!o.threads_given) {
      ts.clear();
      const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      for (int t = 1; t <= n; ++t) ts.push_back(t);
    }
    std::vector<std::string> names = o.shapes;
    if (names.empty()) names = {"P1"};
    for (const auto& n : names)
      for (int t : ts) pts.push_back({n, {}, false, t, t});
    return pts;
  }
  const Shape base = parse_shape(base_name(o.sweep == "seq" ? "P1" : "X1"), o.causal);
  std::vector<std::int64_t> values = o.values;
  if (values.empty()) {
    if (o.sweep == "seq") {
      for (std::int64_t L = 128; L <= 16384; L *= 2) values.push_back(L);
    } else {
      for (std::int64_t b = 1; b <= 64; b *= 2) values.push_back(b);
    }
  }
  for (std::int64_t v : values) {
    Shape s = o.sweep == "seq" ? with_seq(base, v) : base;
    if (o.sweep == "batch") s.B = v;
    s.name = base.name;
    for (int t : o.threads) pts.push_back({"", s, true, t, v});
  }
  return pts;
}

// --cold: a buffer of twice the last-level cache this machine reports (at least 64 MiB), written
// once, then read a line at a time before every timed call, so that the call finds its inputs in
// DRAM as each layer of a many-layer model does. Without it a decode step whose bytes fit the
// L3 (LD8's 218 MB in a 300 MiB L3) reads part of them from there call after call, while the
// read probe's 1 GiB never does. Reading, not writing, leaves the buffer's lines clean: no
// write-back of it falls into the timed call. The other cores' private L2s keep what they hold.
class Flusher {
 public:
  Flusher() {
    const Machine& m = this_machine();
    const std::int64_t llc = std::max(m.l3_bytes, m.l2_bytes * std::max(1, m.logical_cpus));
    const std::size_t bytes = std::max<std::size_t>(std::size_t{64} << 20, 2 * llc);
    words_.resize(bytes / sizeof(std::uint64_t));
    for (std::size_t i = 0; i < words_.size(); ++i) words_[i] = i;
  }
  // One word of every 64 bytes: every cache line of the buffer, wherever it starts.
  void flush() {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < words_.size(); i += 8) sum += words_[i];
    sink_ = sum;
  }
  std::size_t mib() const { return words_.size() * sizeof(std::uint64_t) >> 20; }

 private:
  std::vector<std::uint64_t> words_;
  volatile std::uint64_t sink_ = 0;
};

// The probes, per (target cap, threads); the best reading over providers and over the runs
// before and after the cases (a neighbour on a shared core lowers single readings).
struct Probes {
  bool small_pages = false;  // measure bw_4k as well
  std::map<std::pair<int, int>, double> peak, tile, block, bw, bw_4k;
  void measure(const std::vector<Variant>& variants, const std::vector<int>& threads) {
    for (int t : threads) {
      for (std::size_t i = 0; i < variants.size(); ++i) {
        const Variant& v = variants[i];
        const auto same_probe = [&](const Variant& u) {
          return u.cap == v.cap && u.simd == v.simd;
        };
        if (std::any_of(variants.begin(), variants.begin() + i, same_probe)) continue;
        Context ctx(t);
        ctx.set_max_target(v.cap);
        ctx.set_simd(v.simd);
        const auto key = std::make_pair(static_cast<int>(v.cap), t);
        peak[key] = std::max(peak[key], measure_fma_peak_gflops(t, &ctx));
        tile[key] = std::max(tile[key], measure_tile_gflops(t, &ctx));
        block[key] = std::max(block[key], measure_block_gflops(t, &ctx));
        bw[key] = std::max(bw[key], measure_read_bandwidth_gbps(t, std::size_t{1} << 30, &ctx));
        if (small_pages) {
          bw_4k[key] = std::max(bw_4k[key], measure_read_bandwidth_gbps(t, std::size_t{1} << 30,
                                                                        &ctx, ProbePages::small));
        }
      }
    }
  }
};

std::string cell(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v.get<double>());
    return buf;
  }
  return v.dump();
}

// Flattens {"machine": {"cpu": ..}} into "machine.cpu" columns.
std::vector<std::pair<std::string, Json>> flat(const Json& r) {
  std::vector<std::pair<std::string, Json>> out;
  for (const auto& [k, v] : r.items()) {
    if (v.is_object()) {
      for (const auto& [k2, v2] : v.items()) out.emplace_back(k + "." + k2, v2);
    } else {
      out.emplace_back(k, v);
    }
  }
  return out;
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string format_records(const std::vector<Json>& recs, const std::string& fmt) {
  std::ostringstream s;
  if (fmt == "json") {
    for (const auto& r : recs) s << r.dump() << "\n";
    return s.str();
  }
  if (recs.empty()) return "";
  // Columns: the union of every record's fields, in first-seen order (decode rows add pct_bw).
  std::vector<std::string> cols;
  for (const auto& r : recs) {
    for (const auto& [k, v] : flat(r)) {
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
    }
  }
  if (fmt == "md") {
    // The machine is the same for every row: said once above the table, not in every row.
    const Json& m = recs.front()["machine"];
    s << "Machine: " << m["cpu"].get<std::string>() << " (" << m["vendor"].get<std::string>()
      << "), " << m["logical_cpus"] << " logical CPUs, L1d " << m["l1d_kib"] << " KiB, L2 "
      << m["l2_kib"] << " KiB; cpuattn " << recs.front()["version"].get<std::string>() << " ("
      << recs.front()["revision"].get<std::string>() << ")\n\n";
    std::erase_if(cols, [](const std::string& c) {
      return c.rfind("machine.", 0) == 0 || c == "version" || c == "revision";
    });
  }
  const auto row = [&](const Json& r) {
    std::vector<std::string> cells;
    const auto f = flat(r);
    for (const auto& c : cols) {
      auto it = std::find_if(f.begin(), f.end(), [&](const auto& kv) { return kv.first == c; });
      cells.push_back(it == f.end() ? "" : cell(it->second));
    }
    return cells;
  };
  const char* sep = fmt == "md" ? " | " : ",";
  const auto line = [&](const std::vector<std::string>& cells) {
    if (fmt == "md") s << "| ";
    for (std::size_t i = 0; i < cells.size(); ++i) {
      s << (i ? sep : "") << (fmt == "csv" ? csv_quote(cells[i]) : cells[i]);
    }
    s << (fmt == "md" ? " |\n" : "\n");
  };
  line(cols);
  if (fmt == "md") line(std::vector<std::string>(cols.size(), "---"));
  for (const auto& r : recs) line(row(r));
  return s.str();
}

void print_table(const Options& o, const std::vector<Json>& recs, const Probes& pr,
                 const std::vector<Variant>& variants, const std::vector<int>& threads,
                 std::size_t flush_mib) {
  const Machine& m = this_machine();
  std::printf("cpuattn bench: %s, %d logical CPUs; cpuattn %s (%s); median of %d runs\n",
              m.cpu.c_str(), m.logical_cpus, m.version.c_str(), m.revision.c_str(), o.repeat);
  if (flush_mib > 0) {
    std::printf("cold: %zu MiB read before every timed call (twice the last-level cache)\n",
                flush_mib);
  }
  if (o.huge_pages) {
    std::printf(
        "inputs and outputs of 2 MiB and more on 2 MiB pages (MADV_HUGEPAGE), as the "
        "read probe's\n");
  }
  std::vector<Target> caps;
  for (const Variant& v : variants) {
    if (std::find(caps.begin(), caps.end(), v.cap) == caps.end()) caps.push_back(v.cap);
  }
  for (Target cap : caps) {
    Context capped(1);
    capped.set_max_target(cap);
    for (int t : threads) {
      const auto key = std::make_pair(static_cast<int>(cap), t);
      std::printf(
          "machine peak, target %s, %d thread%s: %.0f GFLOP/s FMA (score micro-kernel on L1 "
          "data: %.0f, %.0f%%; one flash block on cached data: %.0f, %.0f%%), %.1f GB/s read\n",
          target_name(active_target(&capped)), t, t > 1 ? "s" : "", pr.peak.at(key),
          pr.tile.at(key), 100.0 * pr.tile.at(key) / pr.peak.at(key), pr.block.at(key),
          100.0 * pr.block.at(key) / pr.peak.at(key), pr.bw.at(key));
      if (pr.small_pages) std::printf("  and %.1f GB/s read on 4 KiB pages\n", pr.bw_4k.at(key));
    }
  }
  const bool threads_sweep = o.sweep == "threads";
  std::printf("\n%-6s %-34s %-11s %-7s %-9s %7s %10s %9s %7s %8s %6s", "shape", "dims", "target",
              "simd", "dtype", "threads", "median_ms", "GFLOP/s", "%peak", "GB/s", "%bw");
  if (pr.small_pages) std::printf(" %6s", "%bw4k");
  std::printf(" %9s %-6s %7s", "limit_ms", "bound", "%limit");
  if (threads_sweep) std::printf(" %8s %6s %8s", "speedup", "eff", "fma_x");
  if (!o.tweaks.empty()) std::printf(" %-11s", "tweak");
  std::printf("\n");
  for (const Json& r : recs) {
    const std::string name = r["shape"].get<std::string>();
    std::string dt = r["dtype"].get<std::string>();
    if (r["kv_dtype"] != r["dtype"]) dt += "/" + r["kv_dtype"].get<std::string>();
    std::printf("%-6s %-34s %-11s %-7s %-9s %7d %10.3f %9.1f %6.1f%% %8.1f",
                name.find(',') != std::string::npos ? "-" : name.c_str(),
                r["dims"].get<std::string>().c_str(), r["target"].get<std::string>().c_str(),
                r["simd"].get<std::string>().c_str(), dt.c_str(), r["threads"].get<int>(),
                r["median_ms"].get<double>(), r["gflops"].get<double>(),
                r["pct_peak"].get<double>(), r["gbps"].get<double>());
    const auto percent = [&](const char* field) {
      if (r.contains(field)) {
        std::printf(" %5.1f%%", r[field].get<double>());
      } else {
        std::printf(" %6s", "");
      }
    };
    percent("pct_bw");
    if (pr.small_pages) percent("pct_bw_4k");
    std::printf(" %9.3f %-6s %6.1f%%", r["limit_ms"].get<double>(),
                r["limit"].get<std::string>().c_str(), r["pct_limit"].get<double>());
    if (threads_sweep) {
      std::printf(" %8.2f %5.0f%% %8.2f", r["speedup"].get<double>(),
                  100.0 * r["efficiency"].get<double>(), r["fma_speedup"].get<double>());
    }
    if (!o.tweaks.empty()) std::printf(" %-11s", r["tweak"].get<std::string>().c_str());
    std::printf("\n");
  }
}

// What a run measures: the points, the (target cap, provider) variants timed at each, the dtype
// pairs and score variants, and the thread counts that the probes measure.
struct BenchPlan {
  std::vector<Point> points;
  std::vector<Variant> variants;
  Layout layout;
  std::vector<DtypePair> dtype_pairs;
  std::vector<int> threads;
};

BenchPlan plan_bench(const Options& o) {
  BenchPlan bp;
  bp.points = make_points(o);
  std::vector<Simd> providers;
  for (const auto& name : o.simd) providers.push_back(parse_simd(name));
  if (providers.empty()) providers.push_back(default_context().simd());
  const std::vector<std::string> tweaks =
      o.tweaks.empty() ? std::vector<std::string>{"none"} : o.tweaks;
  for (const auto& t : o.targets)
    for (Simd s : providers)
      for (const auto& tw : tweaks) bp.variants.push_back({parse_target(t), s, tw});
  bp.layout = parse_layout(o.layout);
  for (const auto& name : o.variants) {
    const ScoreVariant sv = parse_variant(name);
    for (const auto& q : o.dtypes) {
      const DType qd = parse_dtype(q, "--dtype", false);
      if (o.kv_dtypes.empty()) bp.dtype_pairs.push_back({qd, qd, sv});
      for (const auto& kv : o.kv_dtypes)
        bp.dtype_pairs.push_back({qd, parse_dtype(kv, "--kv-dtype", true), sv});
    }
  }
  for (const Point& p : bp.points) {
    if (std::find(bp.threads.begin(), bp.threads.end(), p.threads) == bp.threads.end())
      bp.threads.push_back(p.threads);
  }
  std::sort(bp.threads.begin(), bp.threads.end());
  return bp;
}

// A measured (point, variant): its record so far, the work that makes its rates, and the target
// cap whose probes put it in proportion.
struct Row {
  Json rec;
  double flops, bytes;
  bool memory_bound;
  Target cap;
  std::vector<WorkPart> parts;
};

// The record of one (point, variant, dtype pair) from its sorted times (ms).
Json point_record(const Options& o, const Point& pt, const Case& c, const Case& ci,
                  const DtypePair& dp, Context& ctx, const std::vector<double>& ms) {
  Json r;
  r["shape"] = c.name;
  r["dims"] = ci.dims;
  if (pt.custom) {
    const Shape& s = pt.shape;
    r["B"] = s.B, r["H"] = s.H, r["Lq"] = s.Lq, r["Lk"] = s.Lk, r["D"] = s.D;
    r["Hkv"] = s.Hkv, r["Dv"] = s.Dv, r["causal"] = s.causal;
  }
  if (!o.sweep.empty()) {
    r["sweep"] = o.sweep;
    r["value"] = pt.value;
  }
  r["threads"] = pt.threads;
  r["target"] = target_name(active_target(&ctx));
  r["simd"] = simd_name(active_simd(&ctx));
  r["dtype"] = short_dtype_name(dp.q);
  r["kv_dtype"] = short_dtype_name(dp.kv);
  r["variant"] = variant_name(dp.variant);
  if (ci.layout != nullptr) r["layout"] = ci.layout;
  // Which products ran natively on bf16 (vdpbf16ps), for bf16 Q with bf16 K/V.
  if (dp.q == DType::bf16 && dp.kv == DType::bf16) r["bf16_path"] = active_bf16_path(&ctx);
  r["repeat"] = o.repeat;
  r["median_ms"] = ms[ms.size() / 2];
  r["best_ms"] = ms.front();
  return r;
}

// On a terminal, once a run has taken 2 s: which point of how many runs now.
struct Progress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool tty = ::isatty(2) != 0, shown = false;

  void show(std::size_t i, std::size_t n, const Case& c, int threads) {
    if (!tty || std::chrono::steady_clock::now() - start <= std::chrono::seconds(2)) return;
    std::fprintf(stderr, "\r[%zu/%zu] %s %s, %d thread%s   ", i + 1, n, c.name.c_str(),
                 c.dims.c_str(), threads, threads > 1 ? "s" : "");
    shown = true;
  }
  void clear() const {
    if (shown) std::fprintf(stderr, "\r%60s\r", "");
  }
};

// Times point pi: every (variant, dtype pair) in turns, o.repeat runs each; appends their rows.
void time_point(const Options& o, const BenchPlan& bp, std::size_t pi, Progress& progress,
                Flusher* flusher, std::vector<Row>& rows) {
  const Point& pt = bp.points[pi];
  // Inputs per point, freed before the next one: a sequence sweep's largest case alone is
  // hundreds of MB.
  // One case per dtype pair (each has its inputs); every (variant, dtype pair) is timed in turns.
  std::vector<Case> cases;
  for (const DtypePair& dp : bp.dtype_pairs) {
    cases.push_back(pt.custom
                        ? attention_case(pt.shape, dp.q, dp.kv, dp.variant, bp.layout)
                        : make_case(pt.case_name, o.causal, dp.q, dp.kv, dp.variant, bp.layout));
  }
  progress.show(pi, bp.points.size(), cases[0], pt.threads);
  // One context per variant, timed in turns (run r of every variant, then run r + 1), so a
  // neighbour's load on the shared machine falls on all variants alike.
  std::vector<std::unique_ptr<Context>> ctxs;
  for (const Variant& v : bp.variants) {
    ctxs.push_back(std::make_unique<Context>(pt.threads));
    ctxs.back()->set_max_target(v.cap);
    ctxs.back()->set_simd(v.simd);
    set_plan_tweak(*ctxs.back(), v.tweak);
    for (const Case& dc : cases) dc.run(*ctxs.back());  // warm-up: scratch, page faults, threads
  }
  const std::size_t nd = cases.size();
  // A threads sweep also probes the FMA rate right before and right after the point's timed
  // runs: a neighbour that holds a core only during the cases escapes the run-wide probes
  // (seen: S1 at 1.2x on 2 threads while those read 1.97x), not these. The lower reading is
  // kept: the machine this point actually had.
  const bool point_probe = o.sweep == "threads";
  double point_fma = point_probe ? measure_fma_peak_gflops(pt.threads, ctxs[0].get()) : 0.0;
  std::vector<std::vector<double>> ms(bp.variants.size() * nd);
  for (int r = 0; r < o.repeat; ++r) {
    for (std::size_t i = 0; i < ms.size(); ++i) {
      if (flusher != nullptr) flusher->flush();
      const auto t0 = std::chrono::steady_clock::now();
      cases[i % nd].run(*ctxs[i / nd]);
      ms[i].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (point_probe) {
    point_fma = std::min(point_fma, measure_fma_peak_gflops(pt.threads, ctxs[0].get()));
  }
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const Case& ci = cases[i % nd];
    std::sort(ms[i].begin(), ms[i].end());
    Json r = point_record(o, pt, cases[0], ci, bp.dtype_pairs[i % nd], *ctxs[i / nd], ms[i]);
    if (point_probe) r["point_fma_gflops"] = point_fma;
    if (!o.tweaks.empty()) r["tweak"] = bp.variants[i / nd].tweak;
    if (flusher != nullptr) r["cold_mib"] = flusher->mib();
    if (o.huge_pages) r["huge_pages"] = true;
    rows.push_back(
        {std::move(r), ci.flops, ci.bytes, ci.memory_bound, bp.variants[i / nd].cap, ci.parts});
  }
}

// Rates, proportions and (for a threads sweep) speed-up against 1 thread of the same case and
// variant, completing row.rec.
void add_rates(const Options& o, Row& row, const std::vector<Row>& rows, Probes& probes) {
  Json& r = row.rec;
  const int t = r["threads"].get<int>();
  const double med = r["median_ms"].get<double>();
  const auto key = std::make_pair(static_cast<int>(row.cap), t);
  const double gflops = row.flops / (med * 1e-3) * 1e-9;
  const double gbps = row.bytes / (med * 1e-3) * 1e-9;
  r["gflops"] = gflops;
  r["gbps"] = gbps;
  r["peak_gflops"] = probes.peak[key];
  r["pct_peak"] = 100.0 * gflops / probes.peak[key];
  r["tile_gflops"] = probes.tile[key];
  r["block_gflops"] = probes.block[key];
  r["read_gbps"] = probes.bw[key];
  if (row.memory_bound) r["pct_bw"] = 100.0 * gbps / probes.bw[key];
  if (probes.small_pages) {
    r["read_gbps_4k"] = probes.bw_4k[key];
    if (row.memory_bound) r["pct_bw_4k"] = 100.0 * gbps / probes.bw_4k[key];
  }
  // The model's limit (cases.h: WorkPart) at this run's probes: FMA time at the softmax-adjusted
  // share of the peak or read time, whichever is longer, part after part.
  // AMX runs the tiled blocks only: a decoding step's streamed blocks keep the f32 units.
  Products products = products_of(r.value("bf16_path", ""));
  if (products == Products::tiles && row.memory_bound) products = Products::f32;
  r["limit_ms"] = limit_ms(row.parts, probes.peak[key], probes.bw[key], products);
  r["limit"] = limit_kind(row.parts, probes.peak[key], probes.bw[key], products);
  r["pct_limit"] = 100.0 * r["limit_ms"].get<double>() / med;
  if (o.sweep == "threads") {
    double base_ms = 0;
    for (const Row& other : rows) {
      const Json& q = other.rec;
      if (q["threads"].get<int>() == 1 && q["dims"] == r["dims"] && q["target"] == r["target"] &&
          q["simd"] == r["simd"] && q["dtype"] == r["dtype"] && q["kv_dtype"] == r["kv_dtype"] &&
          q.value("tweak", "") == r.value("tweak", "")) {
        base_ms = q["median_ms"].get<double>();
      }
    }
    const double sp = base_ms > 0 ? base_ms / med : 0.0;
    const auto key1 = std::make_pair(static_cast<int>(row.cap), 1);
    r["speedup"] = sp;
    r["efficiency"] = sp / t;
    // This point's FMA probe against the run's best 1-thread reading: below the thread count
    // when a core was shared while this point ran.
    r["fma_speedup"] =
        probes.peak.count(key1) ? r["point_fma_gflops"].get<double>() / probes.peak[key1] : 0.0;
  }
  r["machine"] = machine_json();
  r["version"] = this_machine().version;
  r["revision"] = this_machine().revision;
}

// The records as the table, and as JSON, CSV or Markdown on stdout or in --out (whose extension
// names the format when no flag does).
void write_results(const Options& o, const std::vector<Json>& recs, const Probes& probes,
                   const BenchPlan& bp, std::size_t flush_mib) {
  std::string fmt = o.json ? "json" : o.csv ? "csv" : o.md ? "md" : "";
  if (!o.out.empty()) {
    if (fmt.empty()) {
      const auto ends = [&](const char* e) {
        const std::string ext(e);
        return o.out.size() >= ext.size() &&
               o.out.compare(o.out.size() - ext.size(), ext.size(), ext) == 0;
      };
      fmt = ends(".csv") ? "csv" : ends(".md") ? "md" : "json";
    }
    std::ofstream f(o.out);
    f << format_records(recs, fmt);
    if (!f) throw std::runtime_error("--out '" + o.out + "': cannot write the file");
    print_table(o, recs, probes, bp.variants, bp.threads, flush_mib);
  } else if (fmt.empty()) {
    print_table(o, recs, probes, bp.variants, bp.threads, flush_mib);
  } else {
    std::fputs(format_records(recs, fmt).c_str(), stdout);
  }
  std::fflush(stdout);
}

int run_bench(const Options& o) {
  set_huge_page_buffers(o.huge_pages);
  const BenchPlan bp = plan_bench(o);
  Probes probes;
  probes.small_pages = o.read_4k;
  probes.measure(bp.variants, bp.threads);
  std::vector<Row> rows;
  Progress progress;
  std::unique_ptr<Flusher> flusher = o.cold ? std::make_unique<Flusher>() : nullptr;
  for (std::size_t pi = 0; pi < bp.points.size(); ++pi) {
    time_point(o, bp, pi, progress, flusher.get(), rows);
  }
  progress.clear();
  probes.measure(bp.variants, bp.threads);
  std::vector<Json> recs;
  for (Row& row : rows) {
    add_rates(o, row, rows, probes);
    recs.push_back(row.rec);
  }
  write_results(o, recs, probes, bp, flusher ? flusher->mib() : 0);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time the fused kernel (f32) and report median ms, GFLOP/s and % of this machine's FMA\n"
      "peak, GB/s and % of read bandwidth, next to the score micro-kernel alone on L1 data (the\n"
      "ceiling of the kernel's arithmetic) and one flash block on cached data (scores, softmax\n"
      "and P V: the ceiling of the fused loop). The probes run before and after the cases; the\n"
      "best reading of each is kept. Several targets and providers are timed in turns in one run.\n"
      "limit_ms is the model's time at those probes: each part of the work (a decode step: the\n"
      "projections, then the attention) takes the longer of its FMA time and its read time, the\n"
      "FMA time of attention at the share of the pipes its products get beside the softmax's\n"
      "~15 operations per score ((D + Dv) / (D + Dv + 15): 89.5% at D 64); bound says which\n"
      "(fma, bw or both) and %limit the achieved fraction of that limit.\n"
      "Named shapes: S1 B32 H12 L128 D64; P1 B1 H16 L2048 D64; P2 B1 H16 L2048 D128 causal;\n"
      "X1 B8 H8 Lq64 Lk1024 D64; D1 B4 H32 Hkv8 Lq1 Lk4096 D128; D2 B8 H32 Hkv8 Lq1 Lk16384 D128;\n"
      "W1 B1 H16 L32768 D64 causal with a 4096-token sliding window (not in the default list:\n"
      "GFLOP/s count attended pairs only, so compare it with P1's); V1 32 requests of 16..512\n"
      "tokens H12 D64 packed (attention_varlen), V1pad the same padded to 512 with key lengths,\n"
      "V1seq one call per request (all count the packed FLOPs; not in the default list); G1 D2\n"
      "from a paged KV cache, shuffled pages of 16 tokens, G1p128 pages of 128, G1k pages of 16\n"
      "of a PagedKvCache (its page stride; pages taken in turns), G1c the same step from\n"
      "contiguous K/V (not in the default list; --kv-dtype applies).\n"
      "Layers: L1 Linear 4096x768 -> 2304 (a fused QKV projection); M1 multi-head attention layer\n"
      "B8 L512 d_model768 H12; M2 its decode step, B8, one new token against 4096 cached ones\n"
      "(GB/s counts weights + KV cache read); --dtype bf16 gives L1, M1, M2 bf16 weights;\n"
      "M1rope, M2rope the same as a decoder layer (Llama 3.1 rotary embedding and per-head\n"
      "QK-norm; not in the default list); LD1, LD8 one decode step of a Llama-3-8B-shaped layer\n"
      "(d_model 4096, H32 Hkv8 D128, Llama 3.1 RoPE, bf16 weights) for 1 or 8 sequences against\n"
      "4096 cached tokens (--kv-dtype; not in the default list).\n"
      "Sweeps (--sweep): threads = strong scaling of each --shape (default P1) from 1 to the\n"
      "machine's logical CPUs (or --threads), with speed-up, parallel efficiency and the FMA\n"
      "probe's own speed-up (below the thread count when a core is shared); seq = Lq = Lk over\n"
      "--values (default 128 ... 16384; a decode shape sweeps Lk) at the first --shape's B, H, D\n"
      "(default P1); batch = B over --values (default 1 ... 64) at the first --shape (default "
      "X1).\n"
      "Every record carries the machine (CPU, cores, caches), target, provider, dtype, version\n"
      "and git revision. --json prints JSON lines (what tools/plot_bench.py reads).\n"
      "Examples:\n"
      "  cpuattn bench --shape P1 --shape 2,8,512,512,64 --threads 1,2 --json\n"
      "  cpuattn bench --shape P1 --simd highway,xsimd --target avx512,avx2\n"
      "  cpuattn bench --shape S1 --threads 1 --repeat 60 --tweak none,no_kv_ahead\n"
      "  cpuattn bench --sweep threads --shape P1 --out scaling.json\n"
      "  cpuattn bench --sweep seq --shape P1 --causal --threads 2 --md");
  cmd->add_option("--shape", opts->shapes,
                  "Named shape or B,H,Lq,Lk,D[,Hkv[,Dv]] (repeatable; default: all named shapes)");
  cmd->add_flag("--causal", opts->causal, "Make every shape causal (top-left)");
  cmd->add_option("--threads", opts->threads, "Thread counts to measure, e.g. 1,2 (default 1,2)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->each([opts](const std::string&) { opts->threads_given = true; });
  cmd->add_option(
         "--target", opts->targets,
         "SIMD target caps to measure: " + target_cap_list() + " (comma list; default best)")
      ->delimiter(',')
      ->check(CLI::IsMember(target_cap_names()));
  cmd->add_option("--simd", opts->simd,
                  "SIMD providers to measure, e.g. highway,xsimd (default: CPUATTN_SIMD, else "
                  "highway)")
      ->delimiter(',')
      ->check(CLI::IsMember({"highway", "xsimd"}));
  cmd->add_option("--tweak", opts->tweaks,
                  "Plan tweaks to time against each other call by call, for tuning on a shared "
                  "machine: " +
                      plan_tweak_list() +
                      " (none: the shipped plan; bench/support/tweaks.h says what each changes; "
                      "comma list; records gain a tweak field; docs/profiling.md)")
      ->delimiter(',')
      ->check(CLI::IsMember(plan_tweak_names()));
  cmd->add_option("--dtype", opts->dtypes,
                  "Q (and out) dtypes to measure: f32, bf16, f16 (comma list; default f32)")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--kv-dtype", opts->kv_dtypes,
                  "K/V dtypes: " + dtype_choices(true) +
                      " (comma list; default: the --dtype of each run). Every --dtype is measured "
                      "with every --kv-dtype.")
      ->delimiter(',')
      ->check(CLI::IsMember(dtype_names(true)));
  cmd->add_option("--variant", opts->variants,
                  "Score variants to measure on every attention shape, timed in turns: plain, "
                  "softcap (30), alibi (standard slopes), sinks (one per head), all (the three) "
                  "(comma list; default plain)")
      ->delimiter(',')
      ->check(CLI::IsMember({"plain", "softcap", "alibi", "sinks", "all"}));
  cmd->add_option("--layout", opts->layout,
                  "Memory layout of the attention shapes' Q, K, V and out: bhld ([B, H, L, D], "
                  "the default) or blhd ([B, L, H, D], as a projection writes them and ONNX "
                  "Runtime's MultiHeadAttention reads them)")
      ->check(CLI::IsMember({"bhld", "blhd"}));
  cmd->add_flag(
      "--cold", opts->cold,
      "Read a buffer of twice the last-level cache before every timed call (untimed), "
      "so that each call reads its inputs from memory; records carry the buffer's size, cold_mib");
  cmd->add_flag("--huge-pages", opts->huge_pages,
                "Put each input and output of 2 MiB or more on 2 MiB pages advised MADV_HUGEPAGE, "
                "as the read probe's buffer is (where the kernel grants transparent huge pages); "
                "records carry huge_pages");
  cmd->add_flag("--read-4k", opts->read_4k,
                "Probe reads on 4 KiB pages as well (advised MADV_NOHUGEPAGE, as memory from the "
                "default allocator lies), the ceiling of a plain stream over the cases' inputs "
                "without --huge-pages; records carry read_gbps_4k (and pct_bw_4k where they carry "
                "pct_bw)");
  cmd->add_option("--repeat", opts->repeat,
                  "Timed runs per case; the median is reported (default 7; 3 for sweeps)")
      ->check(CLI::PositiveNumber)
      ->each([opts](const std::string&) { opts->repeat_given = true; });
  cmd->add_option("--sweep", opts->sweep, "threads, seq or batch (see above)")
      ->check(CLI::IsMember({"threads", "seq", "batch"}));
  cmd->add_option("--values", opts->values, "Values of a seq or batch sweep, e.g. 256,1024,4096")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  auto* j = cmd->add_flag("--json", opts->json, "JSON lines, one object per record");
  auto* c = cmd->add_flag("--csv", opts->csv, "CSV with a header row");
  auto* m = cmd->add_flag("--md", opts->md, "A Markdown table");
  j->excludes(c, m);
  c->excludes(m);
  cmd->add_option("--out", opts->out,
                  "Write the records to this file (format: --json/--csv/--md, else from the "
                  "extension .csv/.md, else JSON lines); the table still goes to stdout");
  cmd->callback([opts, &exit_code] {
    try {
      Options o = *opts;
      if (!o.repeat_given && !o.sweep.empty()) o.repeat = 3;
      if (!o.values.empty() && o.sweep != "seq" && o.sweep != "batch") {
        throw std::invalid_argument("--values needs --sweep seq or --sweep batch");
      }
      exit_code = run_bench(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cpuattn: %s\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace cpuattn::cli
