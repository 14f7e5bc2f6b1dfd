// End-to-end tests of the bundled measuring tools: `cpuattn profile`, the sweeps and output
// formats of `cpuattn bench`, CPUATTN_VERBOSE / CPUATTN_TRACE in a program, and
// tools/plot_bench.py on a fixture file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_test_util.h"
#include "cpuattn/cpuattn.h"

#ifndef CPUATTN_SOURCE_DIR
#error "CPUATTN_SOURCE_DIR must be the project's source directory"
#endif

namespace {

using cpuattn::cli_test::Result;
using cpuattn::cli_test::slurp;
using Cli = cpuattn::cli_test::CliTest;
using Json = nlohmann::json;

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::vector<Json> json_lines(const std::string& s) {
  std::vector<Json> out;
  for (const auto& l : lines_of(s)) out.push_back(Json::parse(l));
  return out;
}

// The machine description and build every record carries.
void expect_machine(const Json& r) {
  for (const char* k : {"cpu", "vendor", "logical_cpus", "l1d_kib", "l2_kib", "l3_kib"})
    EXPECT_TRUE(r.at("machine").contains(k)) << k << " in " << r.dump();
  for (const char* k : {"target", "simd", "dtype", "version", "revision", "peak_gflops",
                        "read_gbps", "gflops", "pct_peak", "median_ms"})
    EXPECT_TRUE(r.contains(k)) << k << " in " << r.dump();
}

unsigned cpus() { return std::max(1u, std::thread::hardware_concurrency()); }

TEST_F(Cli, ProfileReportsPhasesThreadsRooflineAndCounters) {
  // Causal: the tiled units' phases (an unmasked short shape runs keys as rows, without pack_kv).
  const Result j = run("profile --shape 1,4,256,256,32 --causal --threads 2 --repeat 2 --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const Json r = Json::parse(j.out);
  for (const char* p : {"pack_kv", "scores", "softmax", "pv"})
    EXPECT_TRUE(r["phases"].contains(p)) << p << " in " << j.out;
  double share = 0;
  for (const auto& [name, v] : r["phases"].items()) share += v["share"].get<double>();
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_EQ(r["thread_busy_ms"].size(), std::min(2u, cpus()));
  EXPECT_GE(r["imbalance"].get<double>(), 1.0);
  const std::string bound = r["roofline"]["bound"];
  EXPECT_TRUE(bound == "compute" || bound == "memory") << bound;
  EXPECT_GT(r["roofline"]["fma_peak_gflops"].get<double>(), 0);
  EXPECT_GT(r["roofline"]["block_gflops"].get<double>(), 0);
  // A compute-bound f32 call splits its phases into the loop and the work beside it.
  if (bound == "compute") {
    ASSERT_TRUE(r["roofline"].contains("loop_ms")) << j.out;
    EXPECT_NEAR(
        r["roofline"]["loop_ms"].get<double>() + r["roofline"]["outside_loop_ms"].get<double>(),
        r["phase_total_ms"].get<double>(), 1e-6 * r["phase_total_ms"].get<double>());
    EXPECT_GT(r["roofline"]["loop_at_block_ms"].get<double>(), 0);
  }
  // Hardware counters, or the reason there are none.
  EXPECT_TRUE(r["counters"].contains("cycles") || r.contains("hardware_counters_unavailable"))
      << j.out;
  EXPECT_EQ(r["target"], cpuattn::target_name(cpuattn::active_target()));

  const Result t = run("profile --shape D1 --kv-dtype int8 --threads 1 --repeat 1");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  // The header names the call's element types (it said f32 whatever they were).
  EXPECT_NE(t.out.find("Q f32, K/V int8, out f32"), std::string::npos) << t.out;
  for (const char* s : {"Phases", "Threads", "Roofline", "Counters", "scores", "pv", "bound"})
    EXPECT_NE(t.out.find(s), std::string::npos) << s << " in\n" << t.out;
  EXPECT_TRUE(t.out.find("IPC") != std::string::npos ||
              t.out.find("hardware counters are unavailable") != std::string::npos)
      << t.out;
}

TEST_F(Cli, ProfileTraceOpensAsAChromeTrace) {
  const Result r = run("profile --shape 2,4,200,200,32 --threads 2 --repeat 2 --trace t.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(slurp(path("t.json")));
  std::set<int> task_tracks;
  int calls = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e["ph"] == "X" && e["cat"] == "task") task_tracks.insert(e["tid"].get<int>());
    if (e["ph"] == "X" && e["cat"] == "call") ++calls;
  }
  EXPECT_EQ(calls, 2);
  EXPECT_GE(task_tracks.size(), 1u);
  EXPECT_LE(task_tracks.size(), std::min(2u, cpus()));
}

// CPUATTN_VERBOSE in any program: one line per library call on stderr, naming the target the
// call ran on (here capped by the benchmark's --target).
TEST_F(Cli, VerboseEnvLogsEveryCallWithItsTarget) {
  for (const char* target : {"sse4", "best"}) {
    ::setenv("CPUATTN_VERBOSE", "2", 1);
    const Result r = run(
        std::string("bench --shape 1,2,64,64,16 --threads 1 --repeat 3 --json --target ") + target);
    ::unsetenv("CPUATTN_VERBOSE");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    cpuattn::Context c(1);
    c.set_max_target(cpuattn::parse_target(target));
    const std::string want =
        std::string(",target=") + cpuattn::target_name(cpuattn::active_target(&c)) + ",";
    int calls = 0;
    for (const auto& line : lines_of(r.err)) {
      if (line.rfind("cpuattn_verbose,attention,", 0) != 0) continue;
      ++calls;
      EXPECT_NE(line.find(want), std::string::npos) << line;
      EXPECT_NE(line.find(",phases="), std::string::npos) << line;
    }
    EXPECT_EQ(calls, 4) << r.err;  // the warm-up and 3 timed runs
  }
  const Result quiet = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 1 --json");
  EXPECT_EQ(quiet.err.find("cpuattn_verbose"), std::string::npos) << quiet.err;
}

// --layout blhd times the same shapes through [B, L, H, D] views: the record and its dims name
// the layout, and the library sees strided rows (a tiled f32 call then packs V, whose rows lie
// H * D floats apart, where the [B, H, L, D] default reads V in place; this short unmasked shape
// runs keys as rows either way, `;keys_rows`, with those units for a non-finite task). Layer
// cases refuse it.
TEST_F(Cli, BenchLayoutBlhdTimesStridedViews) {
  for (const std::string layout : {"bhld", "blhd"}) {
    ::setenv("CPUATTN_VERBOSE", "1", 1);
    const Result r =
        run("bench --shape 1,3,64,64,16 --threads 1 --repeat 1 --json --layout " + layout);
    ::unsetenv("CPUATTN_VERBOSE");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<Json> recs = json_lines(r.out);
    ASSERT_EQ(recs.size(), 1u) << r.out;
    EXPECT_EQ(recs[0].at("layout"), layout);
    const bool blhd = layout == "blhd";
    EXPECT_EQ(recs[0].at("dims").get<std::string>().find("[B,L,H,D]") != std::string::npos, blhd)
        << recs[0].dump();
    int calls = 0;
    for (const auto& line : lines_of(r.err)) {
      if (line.rfind("cpuattn_verbose,attention,", 0) != 0) continue;
      ++calls;
      EXPECT_EQ(line.find("tiled=tile_f32_qin+vin_tile_f32+out;keys_rows/") != std::string::npos,
                !blhd)
          << line;
      EXPECT_EQ(line.find("tiled=tile_f32_qin+tile_f32+out;keys_rows/") != std::string::npos, blhd)
          << line;
    }
    EXPECT_EQ(calls, 2) << r.err;  // the warm-up and the timed run
  }
  const Result layer = run("bench --shape M2 --threads 1 --repeat 1 --layout blhd");
  EXPECT_EQ(layer.exit_code, 2);
  EXPECT_NE(layer.err.find("--layout blhd is for attention shapes, not the layer case M2"),
            std::string::npos)
      << layer.err;
  EXPECT_NE(run("bench --shape 1,3,64,64,16 --layout bshd").exit_code, 0);
}

// --cold reads a buffer of twice the last-level cache before every timed call; each record
// says how large it was, and a run without the flag carries no such field.
TEST_F(Cli, BenchColdFlushesTwiceTheLastLevelCache) {
  const Result r = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 2 --json --cold");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Json> recs = json_lines(r.out);
  ASSERT_EQ(recs.size(), 1u) << r.out;
  const Json& m = recs[0].at("machine");
  const std::int64_t llc_mib =
      std::max(m.at("l3_kib").get<std::int64_t>(),
               m.at("l2_kib").get<std::int64_t>() * m.at("logical_cpus").get<std::int64_t>()) /
      1024;
  EXPECT_GE(recs[0].at("cold_mib").get<std::int64_t>(), std::max<std::int64_t>(64, 2 * llc_mib))
      << recs[0].dump();
  const Result table = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 1 --cold");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("MiB read before every timed call"), std::string::npos) << table.out;
  const Result warm = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 1 --json");
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  EXPECT_FALSE(json_lines(warm.out).at(0).contains("cold_mib")) << warm.out;
}

// --huge-pages puts the case's buffers of 2 MiB and more (K and V here: 4 MiB each) on 2 MiB
// pages; the records and the table say so, and a run without the flag carries no such field.
TEST_F(Cli, BenchHugePagesMarksItsRecords) {
  const Result r = run("bench --shape 1,2,1,4096,128 --threads 1 --repeat 2 --json --huge-pages");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Json> recs = json_lines(r.out);
  ASSERT_EQ(recs.size(), 1u) << r.out;
  EXPECT_TRUE(recs[0].at("huge_pages").get<bool>()) << recs[0].dump();
  EXPECT_GT(recs[0].at("median_ms").get<double>(), 0.0) << recs[0].dump();
  const Result table = run("bench --shape 1,2,1,4096,128 --threads 1 --repeat 1 --huge-pages");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("on 2 MiB pages"), std::string::npos) << table.out;
  const Result plain = run("bench --shape 1,2,1,4096,128 --threads 1 --repeat 1 --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_FALSE(json_lines(plain.out).at(0).contains("huge_pages")) << plain.out;
}

// --read-4k adds the read probe on 4 KiB pages: every record carries it, a memory-bound one also
// its fraction of it (the same rate over the other probe), and the table's header prints it.
TEST_F(Cli, BenchRead4kAddsTheSmallPageProbe) {
  const Result r = run("bench --shape 1,2,1,4096,128 --threads 1 --repeat 2 --json --read-4k");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Json> recs = json_lines(r.out);
  ASSERT_EQ(recs.size(), 1u) << r.out;
  const Json& rec = recs[0];
  const double read_4k = rec.at("read_gbps_4k").get<double>();
  EXPECT_GT(read_4k, 0.0) << rec.dump();
  EXPECT_NEAR(rec.at("pct_bw_4k").get<double>(), 100.0 * rec.at("gbps").get<double>() / read_4k,
              1e-9 * rec.at("pct_bw_4k").get<double>())
      << rec.dump();
  const Result table = run("bench --shape 1,2,1,4096,128 --threads 1 --repeat 1 --read-4k");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("GB/s read on 4 KiB pages"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("%bw4k"), std::string::npos) << table.out;
  const Result plain = run("bench --shape 1,2,1,4096,128 --threads 1 --repeat 1 --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_FALSE(json_lines(plain.out).at(0).contains("read_gbps_4k")) << plain.out;
}

// profile --tweak runs the profiled calls with the tweak: a small output is streamed only with
// stream_out, and the record names the tweak.
TEST_F(Cli, ProfileRunsThePlanTweak) {
  const std::string cmd = "profile --shape 2,4,64,64,64 --threads 1 --repeat 2 --json";
  const Result shipped = run(cmd);
  ASSERT_EQ(shipped.exit_code, 0) << shipped.err;
  const Json a = Json::parse(shipped.out);
  EXPECT_FALSE(a.contains("tweak")) << shipped.out;
  EXPECT_EQ(a.at("path").get<std::string>().find("/f32_stream"), std::string::npos) << a.dump();
  const Result tweaked = run(cmd + " --tweak stream_out");
  ASSERT_EQ(tweaked.exit_code, 0) << tweaked.err;
  const Json b = Json::parse(tweaked.out);
  EXPECT_EQ(b.at("tweak"), "stream_out");
  EXPECT_NE(b.at("path").get<std::string>().find("/f32_stream"), std::string::npos) << b.dump();
  EXPECT_NE(run("profile --shape 2,4,64,64,64 --tweak faster").exit_code, 0);
}

// --tweak times plan variants in turns: one record per tweak, each naming its tweak; an unknown
// name is refused, naming the option; a run without the flag carries no tweak field.
TEST_F(Cli, BenchTimesPlanTweaksInTurns) {
  const Result r =
      run("bench --shape 1,2,64,64,16 --threads 1 --repeat 2 --json --tweak none,stream_out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Json> recs = json_lines(r.out);
  ASSERT_EQ(recs.size(), 2u) << r.out;
  EXPECT_EQ(recs[0].at("tweak"), "none");
  EXPECT_EQ(recs[1].at("tweak"), "stream_out");
  const Result table = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 1 --tweak no_kv_ahead");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("no_kv_ahead"), std::string::npos) << table.out;
  const Result bad = run("bench --shape 1,2,64,64,16 --tweak faster");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--tweak"), std::string::npos) << bad.err;
  const Result plain = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 1 --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_FALSE(json_lines(plain.out).at(0).contains("tweak")) << plain.out;
}

// CPUATTN_TRACE in any program: the file is written at exit.
TEST_F(Cli, TraceEnvWritesTheTraceAtExit) {
  ::setenv("CPUATTN_TRACE", path("env_trace.json").c_str(), 1);
  const Result r = run("bench --shape 1,2,64,64,16 --threads 2 --repeat 2 --json");
  ::unsetenv("CPUATTN_TRACE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json j = Json::parse(slurp(path("env_trace.json")));
  int calls = 0;
  for (const auto& e : j.at("traceEvents")) calls += e["ph"] == "X" && e["cat"] == "call";
  EXPECT_EQ(calls, 3);
}

// The model's limit beside each record: at the record's own probes, no shorter than the read time
// of its bytes or the FMA time of its flops at the peak, and %limit the measured fraction of it;
// a decode step's projections and cache read add up (M2: both parts, at least each alone).
TEST_F(Cli, BenchReportsTheModelLimit) {
  const Result r =
      run("bench --shape 1,2,64,64,16 --shape 1,4,1,2048,64,2 --shape M2 --threads 1 "
          "--repeat 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Json> recs = json_lines(r.out);
  ASSERT_EQ(recs.size(), 3u) << r.out;
  for (const Json& j : recs) {
    SCOPED_TRACE(j.dump());
    const double limit = j.at("limit_ms").get<double>(), med = j.at("median_ms").get<double>();
    const double fma_ms = j.at("gflops").get<double>() * med / j.at("peak_gflops").get<double>();
    const double read_ms = j.at("gbps").get<double>() * med / j.at("read_gbps").get<double>();
    EXPECT_GE(limit, fma_ms * 0.999);
    EXPECT_NEAR(j.at("pct_limit").get<double>(), 100.0 * limit / med, 1e-9 * limit / med);
    const std::string bound = j.at("limit").get<std::string>();
    EXPECT_TRUE(bound == "fma" || bound == "bw" || bound == "fma+bw") << bound;
    if (j.contains("pct_bw")) {
      EXPECT_GE(limit, read_ms * 0.999);
    }
  }
  // Attention's FMA share beside the softmax: (D + Dv) / (D + Dv + 15) of the peak at most, so
  // the prefill's limit is its FMA time at the peak divided by that share.
  const Json& pre = recs[0];
  const double fma_ms = pre.at("gflops").get<double>() * pre.at("median_ms").get<double>() /
                        pre.at("peak_gflops").get<double>();
  if (pre.at("limit").get<std::string>() == "fma") {
    EXPECT_NEAR(pre.at("limit_ms").get<double>(), fma_ms * (32.0 + 15.0) / 32.0, 1e-6 * fma_ms);
  }
  // Every table row carries the columns.
  const Result t = run("bench --shape 1,2,64,64,16 --threads 1 --repeat 1");
  EXPECT_NE(t.out.find("limit_ms bound   %limit"), std::string::npos) << t.out;
}

TEST_F(Cli, BenchSweepsParseInEveryFormat) {
  const Result seq =
      run("bench --sweep seq --shape 1,2,64,64,16 --values 32,64,96 --threads 1 --repeat 1 --json");
  ASSERT_EQ(seq.exit_code, 0) << seq.err;
  const auto recs = json_lines(seq.out);
  ASSERT_EQ(recs.size(), 3u) << seq.out;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    expect_machine(recs[i]);
    EXPECT_EQ(recs[i]["sweep"], "seq");
    EXPECT_EQ(recs[i]["value"].get<int>(), 32 * static_cast<int>(i + 1));
    EXPECT_EQ(recs[i]["Lq"], recs[i]["value"]);
    EXPECT_EQ(recs[i]["Lk"], recs[i]["value"]);
  }

  const Result threads = run("bench --sweep threads --shape 1,2,64,64,16 --repeat 1 --json");
  ASSERT_EQ(threads.exit_code, 0) << threads.err;
  const auto tr = json_lines(threads.out);
  ASSERT_EQ(tr.size(), cpus());
  for (std::size_t i = 0; i < tr.size(); ++i) {
    EXPECT_EQ(tr[i]["threads"].get<unsigned>(), i + 1);
    EXPECT_GT(tr[i]["speedup"].get<double>(), 0);
    EXPECT_NEAR(tr[i]["efficiency"].get<double>(), tr[i]["speedup"].get<double>() / (i + 1), 1e-9);
    EXPECT_GT(tr[i]["fma_speedup"].get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(tr[0]["speedup"].get<double>(), 1.0);

  const Result batch =
      run("bench --sweep batch --shape 1,2,16,64,16 --values 1,3 --threads 1 "
          "--repeat 1 --csv --out b.csv");
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  EXPECT_NE(batch.out.find("GFLOP/s"), std::string::npos) << batch.out;  // the table still prints
  const auto rows = lines_of(slurp(path("b.csv")));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_NE(rows[0].find("machine.cpu"), std::string::npos) << rows[0];
  EXPECT_NE(rows[0].find("sweep"), std::string::npos) << rows[0];
  // The CPU model may hold commas: it is quoted then, so count outside quotes only.
  const auto fields = [&](std::string s) {
    bool q = false;
    int n = 1;
    for (char ch : s) {
      if (ch == '"') q = !q;
      n += !q && ch == ',';
    }
    return n;
  };
  EXPECT_EQ(fields(rows[1]), fields(rows[0]));
  EXPECT_EQ(fields(rows[2]), fields(rows[0]));

  const Result md = run("bench --shape 1,2,16,64,16 --threads 1 --repeat 1 --md");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  const auto ml = lines_of(md.out);
  ASSERT_GE(ml.size(), 4u) << md.out;
  EXPECT_EQ(ml[0].rfind("Machine: ", 0), 0u) << md.out;
  EXPECT_EQ(ml[1].rfind("| shape |", 0), 0u) << md.out;
  EXPECT_EQ(ml[2].rfind("| --- |", 0), 0u) << md.out;

  const Result bad = run("bench --values 3");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--values"), std::string::npos) << bad.err;
  const Result both = run("bench --json --csv");
  EXPECT_EQ(both.exit_code, 2);
}

// tools/plot_bench.py draws a PNG from a file of `cpuattn bench --json` lines (a fixture made by
// the sweeps on the machine the charts of docs/performance.md come from).
TEST_F(Cli, PlotBenchMakesAPngFromAFixture) {
  const std::string cmd = "/usr/bin/python3 '" CPUATTN_SOURCE_DIR
                          "/tools/plot_bench.py' '" CPUATTN_SOURCE_DIR
                          "/tests/data/bench_sweeps.jsonl' -o '" +
                          path("out.png") + "' > '" + path("plot.txt") + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(path("plot.txt"));
  const std::string png = slurp(path("out.png"));
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // A file that is not bench output is refused with a message.
  std::ofstream(path("bad.json")) << "{\"x\": 1}\n";
  const std::string bad = "/usr/bin/python3 '" CPUATTN_SOURCE_DIR "/tools/plot_bench.py' '" +
                          path("bad.json") + "' -o '" + path("bad.png") + "' > '" +
                          path("bad.txt") + "' 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(slurp(path("bad.txt")).find("not a `cpuattn bench --json` record"), std::string::npos);
}

TEST_F(Cli, HelpOfTheMeasuringCommandsExplainsOptionsWithExamples) {
  const Result b = run("bench --help");
  ASSERT_EQ(b.exit_code, 0);
  for (const char* s : {"--sweep", "--values", "--json", "--csv", "--md", "--out", "--target",
                        "--simd", "Examples", "cpuattn bench --sweep threads"})
    EXPECT_NE(b.out.find(s), std::string::npos) << s;
  const Result p = run("profile --help");
  ASSERT_EQ(p.exit_code, 0);
  for (const char* s : {"--shape", "--threads", "--repeat", "--trace", "--json", "Examples",
                        "cpuattn profile --shape P1"})
    EXPECT_NE(p.out.find(s), std::string::npos) << s;
}

}  // namespace
