// `cpuattn serve-bench`: a simulated service in one process (tools/lib/serve_bench.h): client
// threads send prefill, decode and embedding requests through one shared Context; requests/s,
// tokens/s and latency percentiles per kind, one row per client count; every response checked
// bitwise against a serial recomputation (exit code 1 if any check fails).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "machine.h"
#include "serve_bench.h"

namespace cpuattn::cli {
namespace {

using Json = nlohmann::ordered_json;
using serve::KindStats;
using serve::kKinds;
using serve::ServeBenchOptions;
using serve::ServeBenchResult;

struct Options {
  std::vector<int> clients = {1, 2, 8, 64};
  std::int64_t requests = 20;
  double duration = 0;
  int threads = 0;
  std::string mix = "prefill:1,decode:4,embed:2";
  bool small = false;
  std::string workload = "mix", kv_dtype;
  std::uint64_t seed = 1;
  int sessions = 0;
  bool md = false, json = false, no_verify = false;
};

// "prefill:1,decode:4,embed:2" -> weights; kinds not named get 0.
void parse_mix(const std::string& text, double (&mix)[kKinds]) {
  for (double& w : mix) w = 0;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto colon = item.find(':');
    const std::string name = item.substr(0, colon);
    int k = -1;
    for (int i = 0; i < kKinds; ++i)
      if (name == serve::kind_name(static_cast<serve::Kind>(i))) k = i;
    if (k < 0 || colon == std::string::npos) {
      throw std::invalid_argument("--mix: '" + item +
                                  "' is not KIND:WEIGHT with KIND prefill, decode or embed");
    }
    std::size_t used = 0;
    double w = -1;
    try {
      w = std::stod(item.substr(colon + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() - colon - 1 || !(w >= 0) || w > 1e9) {
      throw std::invalid_argument("--mix: the weight in '" + item + "' must be a number >= 0");
    }
    mix[k] = w;
  }
}

Json kind_json(const KindStats& k) {
  Json j;
  j["requests"] = k.requests;
  j["tokens"] = k.tokens;
  j["requests_per_s"] = k.requests_per_s;
  j["tokens_per_s"] = k.tokens_per_s;
  j["mean_ms"] = k.mean_ms;
  j["p50_ms"] = k.p50_ms;
  j["p99_ms"] = k.p99_ms;
  j["max_ms"] = k.max_ms;
  j["mismatches"] = k.mismatches;
  return j;
}

std::string check_text(const ServeBenchResult& r) {
  if (!r.ok()) return "FAILED";
  return r.verified ? "ok" : "not run";
}

Json record(const Options& o, const ServeBenchResult& r, const ServeBenchOptions& so) {
  Json j;
  j["clients"] = r.clients;
  j["threads"] = r.threads;
  j["sessions"] = r.sessions;
  j["target"] = r.target;
  j["simd"] = r.simd;
  j["sizes"] = so.small ? "small" : "full";
  j["workload"] = r.workload;
  j["kv_dtype"] = r.kv_dtype;
  j["mix"] = o.mix;
  j["seed"] = o.seed;
  if (so.duration_s > 0) {
    j["duration_s"] = so.duration_s;
  } else {
    j["requests_per_client"] = so.requests;
  }
  j["wall_s"] = r.wall_s;
  j["requests"] = r.all.requests;
  j["tokens"] = r.all.tokens;
  j["requests_per_s"] = r.all.requests_per_s;
  j["tokens_per_s"] = r.all.tokens_per_s;
  j["all"] = kind_json(r.all);
  for (int k = 0; k < kKinds; ++k) j[r.kinds[k].kind] = kind_json(r.kinds[k]);
  j["check"] = check_text(r);
  j["verify_s"] = r.verify_s;
  j["lost"] = r.lost;
  j["session_errors"] = r.session_errors;
  j["errors"] = r.errors;
  j["mismatches"] = r.mismatches;
  j["failures"] = r.failures;
  j["machine"] = machine_json();
  j["version"] = this_machine().version;
  j["revision"] = this_machine().revision;
  return j;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "p50 / p99 / max" of a kind, or "-" when it had no requests.
std::string latency_cell(const KindStats& k) {
  if (k.requests == 0) return "-";
  return fmt("%.3g", k.p50_ms) + " / " + fmt("%.3g", k.p99_ms) + " / " + fmt("%.3g", k.max_ms);
}

void print_md(const std::vector<ServeBenchResult>& rs) {
  const Machine& m = this_machine();
  // As `cpuattn bench --md`: the machine once above the table.
  std::printf("Machine: %s (%s), %d logical CPUs, L1d %lld KiB, L2 %lld KiB; cpuattn %s (%s)\n\n",
              m.cpu.c_str(), m.vendor.c_str(), m.logical_cpus,
              static_cast<long long>(m.l1d_bytes / 1024), static_cast<long long>(m.l2_bytes / 1024),
              m.version.c_str(), m.revision.c_str());
  if (!rs.empty()) {
    std::printf("Workload: %s, decode cache %s.\n\n", rs.front().workload.c_str(),
                rs.front().kv_dtype.c_str());
  }
  std::printf(
      "| clients | threads | requests | wall s | req/s | tokens/s | all ms p50 / p99 / max | "
      "prefill n | prefill ms p50 / p99 / max | decode n | decode ms p50 / p99 / max | embed n | "
      "embed ms p50 / p99 / max | check |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|---:|---|---|\n");
  for (const ServeBenchResult& r : rs) {
    std::printf(
        "| %d | %d | %lld | %.1f | %.1f | %.0f | %s | %lld | %s | %lld | %s | %lld | %s | %s |\n",
        r.clients, r.threads, static_cast<long long>(r.all.requests), r.wall_s,
        r.all.requests_per_s, r.all.tokens_per_s, latency_cell(r.all).c_str(),
        static_cast<long long>(r.kinds[0].requests), latency_cell(r.kinds[0]).c_str(),
        static_cast<long long>(r.kinds[1].requests), latency_cell(r.kinds[1]).c_str(),
        static_cast<long long>(r.kinds[2].requests), latency_cell(r.kinds[2]).c_str(),
        check_text(r).c_str());
  }
}

void print_text_header(const ServeBenchResult& first, const ServeBenchOptions& so,
                       const Options& o) {
  const Machine& m = this_machine();
  std::printf("cpuattn serve-bench: %s, %d logical CPUs; cpuattn %s (%s)\n", m.cpu.c_str(),
              m.logical_cpus, m.version.c_str(), m.revision.c_str());
  std::printf(
      "one shared Context: %d threads, target %s, simd %s; workload %s, %s sizes, decode cache "
      "%s; mix %s; ",
      first.threads, first.target.c_str(), first.simd.c_str(), first.workload.c_str(),
      so.small ? "small" : "full", first.kv_dtype.c_str(), o.mix.c_str());
  if (so.duration_s > 0) {
    std::printf("%.3g s per row\n", so.duration_s);
  } else {
    std::printf("%lld requests per client\n", static_cast<long long>(so.requests));
  }
  std::printf("\n%7s %8s %8s %9s %10s  %-8s %7s %9s %9s %9s %10s\n", "clients", "requests",
              "wall_s", "req/s", "tokens/s", "kind", "n", "p50_ms", "p99_ms", "max_ms", "check");
}

void print_text_row(const ServeBenchResult& r) {
  const auto kind_line = [](const KindStats& k) {
    std::printf("  %-8s %7lld %9.3f %9.3f %9.3f", k.kind.c_str(),
                static_cast<long long>(k.requests), k.p50_ms, k.p99_ms, k.max_ms);
  };
  std::printf("%7d %8lld %8.2f %9.1f %10.0f", r.clients, static_cast<long long>(r.all.requests),
              r.wall_s, r.all.requests_per_s, r.all.tokens_per_s);
  kind_line(r.all);
  std::printf(" %10s\n", check_text(r).c_str());
  for (const KindStats& k : r.kinds) {
    std::printf("%46s", "");
    kind_line(k);
    std::printf("\n");
  }
}

int run(const Options& o) {
  ServeBenchOptions so;
  so.requests = o.requests;
  so.duration_s = o.duration;
  parse_mix(o.mix, so.mix);
  so.small = o.small;
  so.workload = o.workload == "llama" ? serve::Workload::llama : serve::Workload::mix;
  so.kv_dtype = o.kv_dtype;
  so.seed = o.seed;
  so.threads = o.threads;
  so.sessions = o.sessions;
  so.verify = !o.no_verify;
  std::vector<ServeBenchResult> results;
  bool ok = true;
  for (std::size_t i = 0; i < o.clients.size(); ++i) {
    so.clients = o.clients[i];
    ServeBenchResult r = serve::run_serve_bench(so);
    for (const std::string& f : r.failures) {
      std::fprintf(stderr, "cpuattn serve-bench: %d clients: %s\n", r.clients, f.c_str());
    }
    if (!r.ok()) {
      std::fprintf(stderr,
                   "cpuattn serve-bench: %d clients: CHECK FAILED: %lld lost, %lld session "
                   "errors, %lld errors, %lld not bitwise equal to the serial recomputation\n",
                   r.clients, static_cast<long long>(r.lost),
                   static_cast<long long>(r.session_errors), static_cast<long long>(r.errors),
                   static_cast<long long>(r.mismatches));
      ok = false;
    }
    // Rows as they finish (a long sweep shows progress); the Markdown table once at the end.
    if (o.json) {
      std::printf("%s\n", record(o, r, so).dump().c_str());
    } else if (!o.md) {
      if (i == 0) print_text_header(r, so, o);
      print_text_row(r);
    }
    std::fflush(stdout);
    results.push_back(std::move(r));
  }
  if (o.md) print_md(results);
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

void add_serve_bench_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "serve-bench",
      "A simulated service: client threads send a mix of requests through ONE shared Context:\n"
      "  prefill  causal self-attention, B 1, H 8, D 64, L 16 ... 512\n"
      "  decode   one token of a session: MultiHeadAttention::decode (8 heads, 2 K/V heads, D 64)\n"
      "           against the session's KV cache (prompt 16 ... 256 tokens, cleared at 512);\n"
      "           sessions come from a pool, one client at a time\n"
      "  embed    bidirectional batch B 8, H 12, L 32 ... 128, D 64, padded by key lengths\n"
      "(--small shrinks every size). --workload llama keeps the kinds with Llama shapes: decode\n"
      "runs a Llama-3-8B-shaped layer (d_model 4096, 32 heads, 8 K/V heads of 128, Llama 3.1\n"
      "RoPE, bf16 weights) against sessions of 512 ... 3584 prompt tokens cleared at 4096, with a\n"
      "bf16 cache (--kv-dtype); prefill is causal attention, H 32, D 128, L 128 ... 1024.\n"
      "Reports requests/s, tokens/s and p50/p99/max latency of the library call per kind, one\n"
      "row per --clients value. Inputs come from per-request seeds; afterwards every request is\n"
      "recomputed serially on one thread (decode steps replayed in their session's order) and\n"
      "must be bitwise equal, answered once, and never see another session's cache. Exit code 1\n"
      "if a check fails.\n"
      "Examples:\n"
      "  cpuattn serve-bench --clients 1,2,8,64 --duration 5 --md\n"
      "  cpuattn serve-bench --clients 2 --requests 5 --small\n"
      "  cpuattn serve-bench --clients 8 --mix decode:1 --json\n"
      "  cpuattn serve-bench --workload llama --mix prefill:1,decode:8 --clients 1,8,64 "
      "--duration 10 --md");
  cmd->add_option("--clients", opts->clients,
                  "Client thread counts, one row each (comma list; default 1,2,8,64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--requests", opts->requests, "Requests per client (default 20)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  cmd->add_option("--duration", opts->duration,
                  "Seconds per row instead: clients send requests until then")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--threads", opts->threads,
                  "Threads of the shared Context (default: the machine's logical CPUs)")
      ->check(CLI::Range(1, 1 << 16))
      ->type_name("N");
  cmd->add_option("--mix", opts->mix,
                  "Relative weights of the kinds, e.g. prefill:1,decode:4,embed:2 (the default); "
                  "a kind not named gets 0");
  cmd->add_flag("--small", opts->small, "Small sizes (quick checks, sanitizer builds)");
  cmd->add_option("--workload", opts->workload, "mix (the default) or llama (Llama-shaped)")
      ->check(CLI::IsMember({"mix", "llama"}));
  cmd->add_option("--kv-dtype", opts->kv_dtype,
                  "Decode sessions' cache dtype: f32, bf16, f16, int8, ... (default f32; bf16 "
                  "for llama)");
  cmd->add_option("--seed", opts->seed, "Seed of every input (default 1)");
  cmd->add_option("--sessions", opts->sessions,
                  "Decode sessions in the pool (default 2 per client)")
      ->check(CLI::Range(1, 1 << 20));
  auto* j = cmd->add_flag("--json", opts->json, "JSON lines, one object per row");
  auto* m = cmd->add_flag("--md", opts->md, "A Markdown table");
  j->excludes(m);
  cmd->add_flag("--no-verify", opts->no_verify, "Skip the serial recomputation");
  cmd->callback([opts, &exit_code] {
    try {
      exit_code = run(*opts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cpuattn: %s\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace cpuattn::cli
