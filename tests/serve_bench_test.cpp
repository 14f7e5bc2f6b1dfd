// A small run of the service load test (tools/lib/serve_bench.h): many clients on one shared
// Context, every response checked bitwise against a serial recomputation. Labelled
// `concurrency`, so the tsan preset runs it under ThreadSanitizer; a few seconds there, well
// under one in a release build.
#include "serve_bench.h"

#include <cstdio>
#include <exception>
#include <string>

namespace {

using cpuattn::serve::run_serve_bench;
using cpuattn::serve::ServeBenchOptions;
using cpuattn::serve::ServeBenchResult;

int failures = 0;

void expect(bool cond, const std::string& what) {
  if (!cond) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

void print(const char* name, const ServeBenchResult& r) {
  std::printf(
      "%s: %d clients, %d threads, %d sessions, %s/%s: %lld requests (%lld prefill, %lld "
      "decode, %lld embed) in %.3f s, verified in %.3f s: %s\n",
      name, r.clients, r.threads, r.sessions, r.target.c_str(), r.simd.c_str(),
      static_cast<long long>(r.all.requests), static_cast<long long>(r.kinds[0].requests),
      static_cast<long long>(r.kinds[1].requests), static_cast<long long>(r.kinds[2].requests),
      r.wall_s, r.verify_s, r.ok() ? "ok" : "CHECK FAILED");
  for (const std::string& f : r.failures) std::printf("  %s\n", f.c_str());
}

ServeBenchOptions small(int clients, std::int64_t requests) {
  ServeBenchOptions o;
  o.clients = clients;
  o.requests = requests;
  o.small = true;
  o.threads = 2;
  o.seed = 7;
  return o;
}

void run_all() {
  // Every kind, 8 clients on a 2-thread context.
  {
    ServeBenchOptions o = small(8, 20);
    o.mix[0] = 1, o.mix[1] = 1, o.mix[2] = 1;
    const ServeBenchResult r = run_serve_bench(o);
    print("mix", r);
    expect(r.ok() && r.verified, "8 clients, every kind: every check passes");
    expect(r.all.requests == 160, "8 clients x 20 requests answered");
    for (const auto& k : r.kinds) expect(k.requests > 0, "some " + k.kind + " requests ran");
    expect(r.kinds[0].requests + r.kinds[1].requests + r.kinds[2].requests == 160,
           "the kinds add up");
  }
  // Decode only, fewer sessions than clients: clients wait for a session, and sessions move
  // between clients (caches cleared and restarted along the way).
  {
    ServeBenchOptions o = small(8, 16);
    o.mix[0] = 0, o.mix[1] = 1, o.mix[2] = 0;
    o.sessions = 3;
    const ServeBenchResult r = run_serve_bench(o);
    print("decode", r);
    expect(r.ok() && r.verified, "8 clients on 3 sessions: every check passes");
    expect(r.kinds[1].requests == 128, "128 decode steps answered");
  }
  // The full sizes (the CLI's), briefly: the kernels' larger tilings and plans.
  {
    ServeBenchOptions o = small(4, 4);
    o.small = false;
    const ServeBenchResult r = run_serve_bench(o);
    print("full sizes", r);
    expect(r.ok() && r.verified, "4 clients, full sizes: every check passes");
    expect(r.all.requests == 16, "4 clients x 4 requests answered");
  }
  // The checker itself: a corrupted response must be found.
  {
    ServeBenchOptions o = small(2, 3);
    o.corrupt_one = true;
    const ServeBenchResult r = run_serve_bench(o);
    print("corrupted", r);
    expect(!r.ok() && r.mismatches == 1, "a corrupted response is reported, exactly once");
  }
}

}  // namespace

int main() {
  try {
    run_all();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: exception: %s\n", e.what());
    return 1;
  }
  if (failures > 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("serve_bench_test: all checks passed\n");
  return 0;
}
