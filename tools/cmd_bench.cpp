// `cpuattn bench`: times the fused kernel on named or custom shapes and puts each figure in
// proportion to this machine's FMA peak (and read bandwidth for decode), measured before and
// after the cases.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "probes.h"
#include "shapes.h"

namespace cpuattn::cli {
namespace {

using Shape = bench::Shape;
using bench::named_shapes;

Shape parse_shape(const std::string& text, bool causal) {
  if (auto it = named_shapes().find(text); it != named_shapes().end()) {
    Shape s = it->second;
    s.causal = s.causal || causal;
    return s;
  }
  std::vector<std::int64_t> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size() || x < 1) throw std::invalid_argument("");
      v.push_back(x);
    } catch (const std::exception&) {
      throw std::invalid_argument("--shape '" + text +
                                  "': expected a name (S1,P1,P2,X1,D1,D2,L1,M1,M2) or "
                                  "B,H,Lq,Lk,D[,Hkv[,Dv]] of positive integers");
    }
  }
  if (v.size() < 5 || v.size() > 7) {
    throw std::invalid_argument("--shape '" + text + "': expected B,H,Lq,Lk,D[,Hkv[,Dv]]");
  }
  Shape s{
      text,  v[0], v[1], v[2], v[3], v[4], v.size() > 5 ? v[5] : v[1], v.size() > 6 ? v[6] : v[4],
      causal};
  return s;
}

// Attention inputs and outputs are 64-byte aligned, as frameworks allocate tensors (PyTorch's
// CPU allocator aligns to 64): std::vector's 16-byte alignment would keep the kernel off its
// aligned paths (the non-temporal output stores).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  explicit Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  bool operator==(const Aligned64&) const { return true; }
  bool operator!=(const Aligned64&) const { return false; }
};
using AlignedFloats = std::vector<float, Aligned64<float>>;

// Deterministic, cheap fill (a hash of the index): random enough for timing, never zeros.
template <class Vec>
void fill(Vec& x, std::uint32_t seed) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u + seed * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = (static_cast<float>(h & 0xFFFFFF) / float(0xFFFFFF)) * 2.0f - 1.0f;
  }
}

struct Options {
  std::vector<std::string> shapes;
  bool causal = false;
  std::vector<int> threads = {1, 2};
  std::string target = "best";
  std::vector<std::string> simd;  // empty: the default context's provider (CPUATTN_SIMD)
  int repeat = 7;
  bool json = false;
};

// One timed case: its work (FLOPs, and the bytes it must stream for memory-bound cases) and a
// function that runs it once on a context. Inputs are made once per case, outside the timing.
struct Case {
  std::string name, dims;
  double flops = 0, bytes = 0;
  bool memory_bound = false;  // report GB/s against the read bandwidth as well
  std::function<void(Context&)> run;
};

Case attention_case(const Shape& s) {
  struct Data {
    AlignedFloats q, k, v, out;
  };
  auto d = std::make_shared<Data>();
  d->q.resize(s.B * s.H * s.Lq * s.D);
  d->k.resize(s.B * s.Hkv * s.Lk * s.D);
  d->v.resize(s.B * s.Hkv * s.Lk * s.Dv);
  d->out.resize(s.B * s.H * s.Lq * s.Dv);
  fill(d->q, 1);
  fill(d->k, 2);
  fill(d->v, 3);
  AttentionOptions opts;
  opts.causal = s.causal ? Causal::top_left : Causal::none;
  Case c{s.name, s.dims(), s.flops(), s.kv_bytes(), s.decode(), {}};
  c.run = [d, s, opts](Context& ctx) {
    attention(f32_view(d->q.data(), {s.B, s.H, s.Lq, s.D}),
              f32_view(d->k.data(), {s.B, s.Hkv, s.Lk, s.D}),
              f32_view(d->v.data(), {s.B, s.Hkv, s.Lk, s.Dv}),
              f32_view(d->out.data(), {s.B, s.H, s.Lq, s.Dv}), opts, &ctx);
  };
  return c;
}

// Layer cases (README, "Benchmarks"): the dense product of a fused Q/K/V projection, a whole
// multi-head attention layer, and one decoding step against a 4096-token KV cache.
constexpr std::int64_t kDm = 768, kHeads = 12, kTokens = 4096;

std::shared_ptr<MultiHeadAttention> bench_layer() {
  std::vector<float> wq(kDm * kDm), wk(kDm * kDm), wv(kDm * kDm), wo(kDm * kDm), b(kDm);
  fill(wq, 4);
  fill(wk, 5);
  fill(wv, 6);
  fill(wo, 7);
  fill(b, 8);
  for (auto* w : {&wq, &wk, &wv, &wo})
    for (auto& x : *w) x *= 0.036f;  // ~ 1/sqrt(d_model): unit-sized activations
  const auto m = [](const std::vector<float>& w) { return f32_view(w.data(), {kDm, kDm}); };
  const auto bv = f32_view(b.data(), {kDm});
  return std::make_shared<MultiHeadAttention>(
      MhaConfig{kDm, kHeads, 0, 0, 0}, MhaWeights{m(wq), m(wk), m(wv), m(wo), bv, bv, bv, bv});
}

std::optional<Case> layer_case(const std::string& name) {
  if (name == "L1") {  // x [4096, 768] times [Wq | Wk | Wv] [768, 2304]
    const std::int64_t M = 8 * 512, K = kDm, N = 3 * kDm;
    auto x = std::make_shared<std::vector<float>>(M * K);
    auto y = std::make_shared<std::vector<float>>(M * N);
    std::vector<float> w(K * N);
    fill(*x, 9);
    fill(w, 10);
    auto lin = std::make_shared<Linear>(f32_view(w.data(), {K, N}));
    return Case{"L1", "Linear M4096 K768 N2304", 2.0 * M * K * N, 0, false, [=](Context& ctx) {
                  lin->forward(f32_view(x->data(), {M, K}), f32_view(y->data(), {M, N}), &ctx);
                }};
  }
  if (name == "M1") {  // self-attention layer, B 8, L 512
    const std::int64_t B = 8, L = 512;
    auto layer = bench_layer();
    auto x = std::make_shared<std::vector<float>>(B * L * kDm);
    auto out = std::make_shared<std::vector<float>>(B * L * kDm);
    fill(*x, 11);
    const double proj = 2.0 * B * L * kDm * kDm * 4;  // Q, K, V and output projections
    const double attn = 4.0 * B * kHeads * L * L * (kDm / kHeads);
    return Case{"M1", "MHA B8 L512 d768 H12", proj + attn, 0, false, [=](Context& ctx) {
                  layer->forward(f32_view(x->data(), {B, L, kDm}),
                                 f32_view(out->data(), {B, L, kDm}), {}, &ctx);
                }};
  }
  if (name == "M2") {  // one new token per sequence, 8 sequences, 4096 cached tokens each
    const std::int64_t B = 8;
    auto layer = bench_layer();
    auto cache = std::make_shared<KvCache>(layer->make_cache(B, kTokens + 1));
    // Fill the cache with kTokens tokens once; each timed step appends one and is then rolled
    // back, so every run attends to 4097 tokens.
    std::vector<float> kv(B * kHeads * kTokens * (kDm / kHeads));
    fill(kv, 12);
    const TensorView kvv = f32_view(kv.data(), {B, kHeads, kTokens, kDm / kHeads});
    cache->append(kvv, kvv);
    auto x = std::make_shared<std::vector<float>>(B * kDm);
    auto out = std::make_shared<std::vector<float>>(B * kDm);
    fill(*x, 13);
    const double proj = 2.0 * B * kDm * kDm * 4;
    const double attn = 4.0 * B * kHeads * (kTokens + 1) * (kDm / kHeads);
    const double bytes = 4.0 * (4 * kDm * kDm + 2.0 * B * (kTokens + 1) * kDm);
    return Case{
        "M2", "MHA decode B8 cache4096 d768 H12", proj + attn, bytes, true, [=](Context& ctx) {
          layer->decode(f32_view(x->data(), {B, 1, kDm}), *cache,
                        f32_view(out->data(), {B, 1, kDm}), {}, &ctx);
          cache->truncate(kTokens);  // drop the new token: every run sees 4097
        }};
  }
  return std::nullopt;
}

int run_bench(const Options& o) {
  std::vector<std::string> names = o.shapes;
  if (names.empty()) names = {"S1", "P1", "P2", "X1", "D1", "D2", "L1", "M1", "M2"};
  std::vector<Case> cases;
  for (const auto& n : names) {
    if (auto lc = layer_case(n)) {
      cases.push_back(std::move(*lc));
    } else {
      cases.push_back(attention_case(parse_shape(n, o.causal)));
    }
  }
  const Target cap = parse_target(o.target);
  std::vector<Simd> providers;
  for (const auto& name : o.simd) providers.push_back(parse_simd(name));
  if (providers.empty()) providers.push_back(default_context().simd());
  const bool any_memory =
      std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.memory_bound; });

  // The probes run before and after the cases and the best reading of each is kept: on a shared
  // machine one probe can run while a neighbour holds a core (seen here: a 2-thread FMA probe
  // reading 272 GFLOP/s instead of 428, which put P1 at "106% of peak").
  // With several providers, each probe keeps the best provider's reading: the machine's ceiling
  // does not depend on which library emitted the FMAs, and every row is judged against one peak.
  std::map<int, double> peak, tile, bw;
  const auto probe = [&] {
    for (int t : o.threads) {
      for (Simd simd : providers) {
        Context probe_ctx(t);
        probe_ctx.set_max_target(cap);
        probe_ctx.set_simd(simd);
        peak[t] = std::max(peak[t], measure_fma_peak_gflops(t, &probe_ctx));
        tile[t] = std::max(tile[t], measure_tile_gflops(t, &probe_ctx));
        if (any_memory) {
          bw[t] = std::max(bw[t], measure_read_bandwidth_gbps(t, std::size_t{1} << 30, &probe_ctx));
        }
      }
    }
  };
  probe();

  struct Row {
    const Case* c;
    int threads;
    double median_ms;
    std::string target, simd;
  };
  std::vector<Row> rows;
  for (const Case& c : cases) {
    for (int t : o.threads) {
      // One context per provider, timed in turns (run r of every provider, then run r + 1), so a
      // neighbour's load on the shared machine falls on all providers alike.
      std::vector<std::unique_ptr<Context>> ctxs;
      for (Simd simd : providers) {
        ctxs.push_back(std::make_unique<Context>(t));
        ctxs.back()->set_max_target(cap);
        ctxs.back()->set_simd(simd);
        c.run(*ctxs.back());  // warm-up: scratch allocation, page faults, thread start
      }
      std::vector<std::vector<double>> ms(providers.size());
      for (int r = 0; r < o.repeat; ++r) {
        for (std::size_t i = 0; i < providers.size(); ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          c.run(*ctxs[i]);
          ms[i].push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
      }
      for (std::size_t i = 0; i < providers.size(); ++i) {
        std::sort(ms[i].begin(), ms[i].end());
        rows.push_back({&c, t, ms[i][ms[i].size() / 2], target_name(active_target(ctxs[i].get())),
                        simd_name(active_simd(ctxs[i].get()))});
      }
    }
  }
  probe();

  if (!o.json) {
    Context capped(1);
    capped.set_max_target(cap);
    std::printf("cpuattn bench: target %s, median of %d runs\n",
                target_name(active_target(&capped)), o.repeat);
    for (int t : o.threads) {
      std::printf(
          "machine peak, %d thread%s: %.0f GFLOP/s FMA (score micro-kernel on L1 data: %.0f, "
          "%.0f%%)",
          t, t > 1 ? "s" : "", peak[t], tile[t], 100.0 * tile[t] / peak[t]);
      if (any_memory) std::printf(", %.1f GB/s read", bw[t]);
      std::printf("\n");
    }
    std::printf("\n%-5s %-34s %-7s %7s %10s %9s %7s %8s %6s\n", "shape", "dims", "simd", "threads",
                "median_ms", "GFLOP/s", "%peak", "GB/s", "%bw");
  }

  for (const Row& row : rows) {
    const Case& c = *row.c;
    const int t = row.threads;
    const double med = row.median_ms;
    const double gflops = c.flops / (med * 1e-3) * 1e-9;
    const double gbps = c.bytes / (med * 1e-3) * 1e-9;
    const double pct = 100.0 * gflops / peak[t];
    if (o.json) {
      nlohmann::json j = {{"shape", c.name},      {"dims", c.dims},        {"threads", t},
                          {"target", row.target}, {"simd", row.simd},      {"median_ms", med},
                          {"gflops", gflops},     {"gbps", gbps},          {"peak_gflops", peak[t]},
                          {"pct_peak", pct},      {"tile_gflops", tile[t]}};
      if (any_memory) {
        j["read_gbps"] = bw[t];
        j["pct_bw"] = 100.0 * gbps / bw[t];
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-5s %-34s %-7s %7d %10.3f %9.1f %6.1f%% %8.1f",
                  c.name.size() > 5 ? "-" : c.name.c_str(), c.dims.c_str(), row.simd.c_str(), t,
                  med, gflops, pct, gbps);
      if (c.memory_bound && bw.count(t)) std::printf(" %5.1f%%", 100.0 * gbps / bw[t]);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time the fused kernel (f32) and report median ms, GFLOP/s and % of this machine's FMA peak\n"
      "(GB/s of K+V and % of read bandwidth for decode), next to the score micro-kernel alone on\n"
      "L1 data (the ceiling of the kernel's arithmetic). The probes run before and after the\n"
      "cases; the best reading of each is kept.\n"
      "Named shapes: S1 B32 H12 L128 D64; P1 B1 H16 L2048 D64; P2 B1 H16 L2048 D128 causal;\n"
      "X1 B8 H8 Lq64 Lk1024 D64; D1 B4 H32 Hkv8 Lq1 Lk4096 D128; D2 B8 H32 Hkv8 Lq1 Lk16384 D128.\n"
      "Layers: L1 Linear 4096x768 -> 2304 (a fused QKV projection); M1 multi-head attention layer\n"
      "B8 L512 d_model768 H12; M2 its decode step, B8, one new token against 4096 cached ones\n"
      "(GB/s counts weights + KV cache read).\n"
      "Example: cpuattn bench --shape P1 --shape 2,8,512,512,64 --threads 1,2 --json\n"
      "         cpuattn bench --shape P1 --simd highway,xsimd");
  cmd->add_option("--shape", opts->shapes,
                  "Named shape or B,H,Lq,Lk,D[,Hkv[,Dv]] (repeatable; default: all named shapes)");
  cmd->add_flag("--causal", opts->causal, "Make every shape causal (top-left)");
  cmd->add_option("--threads", opts->threads, "Thread counts to measure, e.g. 1,2 (default 1,2)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--target", opts->target, "Cap the SIMD target: scalar, sse4, avx2, avx512, best")
      ->check(CLI::IsMember({"scalar", "sse4", "avx2", "avx512", "best"}));
  cmd->add_option("--simd", opts->simd,
                  "SIMD providers to measure, e.g. highway,xsimd (default: CPUATTN_SIMD, else "
                  "highway); several are timed in turns in one run")
      ->delimiter(',')
      ->check(CLI::IsMember({"highway", "xsimd"}));
  cmd->add_option("--repeat", opts->repeat,
                  "Timed runs per case; the median is reported (default 7)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", opts->json, "One JSON object per case instead of the table");
  cmd->callback([opts, &exit_code] {
    try {
      exit_code = run_bench(*opts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cpuattn: %s\n", e.what());
      exit_code = 2;
    }
  });
}

}  // namespace cpuattn::cli
