#include "serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"

namespace cpuattn::serve {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::prefill:
      return "prefill";
    case Kind::decode:
      return "decode";
    case Kind::embed:
      return "embed";
  }
  return "?";
}

const char* workload_name(Workload workload) {
  return workload == Workload::llama ? "llama" : "mix";
}

namespace {

using Clock = std::chrono::steady_clock;

// ---- Sizes.

struct Sizes {
  // prefill: causal self-attention, B 1.
  std::int64_t p_heads, p_dim, p_len_min, p_len_max;
  // embed: bidirectional, padded by key lengths.
  std::int64_t e_batch, e_heads, e_dim, e_len_min, e_len_max;
  // decode: a MultiHeadAttention layer (d_model = heads * dim), sessions of at most max_len
  // cached tokens that start with a prompt of prompt_min ... prompt_max tokens.
  std::int64_t d_heads, d_kv_heads, d_dim, d_prompt_min, d_prompt_max, d_max_len;
  // The decode layer is a Llama one: Llama 3.1 rotary embedding, bf16 weights.
  bool llama;
  std::int64_t d_model() const { return d_heads * d_dim; }
};

constexpr Sizes kFull{8, 64, 16, 512, 8, 12, 64, 32, 128, 8, 2, 64, 16, 256, 512, false};
constexpr Sizes kSmall{2, 16, 8, 48, 2, 4, 16, 8, 24, 4, 2, 16, 4, 12, 24, false};
constexpr Sizes kLlama{32, 128, 128, 1024, 8, 12, 64, 32, 128, 32, 8, 128, 512, 3584, 4096, true};
constexpr Sizes kLlamaSmall{2, 16, 8, 48, 2, 4, 16, 8, 24, 4, 2, 16, 4, 12, 24, true};

// ---- Deterministic inputs.

constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A small counter-based generator for the sizes of a request.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() { return mix64(state++); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  std::int64_t range(std::int64_t lo, std::int64_t hi) {  // inclusive
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
};

// n values in [-1, 1) from `seed`: element i is a hash of (seed, i), written so that the compiler
// vectorizes it (a client spends little time making its request).
void fill(float* p, std::int64_t n, std::uint64_t seed) {
  const auto s = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t x = s + static_cast<std::uint32_t>(i) * 0x9e3779b9u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = static_cast<float>(x >> 8) * 0x1.0p-23f - 1.0f;
  }
}

// A hash of the bits of n floats (8 independent FNV-1a lanes over 32-bit words, then mixed).
std::uint64_t hash_bits(const float* p, std::int64_t n) {
  std::uint32_t lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = 2166136261u + static_cast<std::uint32_t>(l);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint32_t w[8];
    std::memcpy(w, p + i, sizeof w);
    for (int l = 0; l < 8; ++l) lanes[l] = (lanes[l] ^ w[l]) * 16777619u;
  }
  for (; i < n; ++i) {
    std::uint32_t w;
    std::memcpy(&w, p + i, sizeof w);
    lanes[0] = (lanes[0] ^ w) * 16777619u;
  }
  std::uint64_t h = mix64(static_cast<std::uint64_t>(n));
  for (int l = 0; l < 8; ++l) h = mix64(h ^ lanes[l]);
  return h;
}

std::uint64_t request_id(int client, std::int64_t index) {
  return (static_cast<std::uint64_t>(client) << 32) | static_cast<std::uint64_t>(index);
}
std::uint64_t request_seed(std::uint64_t seed, std::uint64_t id) {
  return mix64(mix64(seed) ^ mix64(id ^ 0x5e5e5e5e00000000ull));
}
std::uint64_t prompt_seed(std::uint64_t seed, int session, std::int64_t epoch) {
  return mix64(mix64(seed ^ 0xa11ce5e55ull) ^ mix64((static_cast<std::uint64_t>(session) << 32) ^
                                                    static_cast<std::uint64_t>(epoch)));
}

Kind pick_kind(std::uint64_t rseed, const double (&mix)[kKinds]) {
  const double total = mix[0] + mix[1] + mix[2];
  double r = Rng{rseed ^ 0x6b696e64ull}.uniform() * total;
  for (int k = 0; k < kKinds - 1; ++k) {
    if (r < mix[k]) return static_cast<Kind>(k);
    r -= mix[k];
  }
  // Rounding can leave r at the end; the last kind with a weight takes it.
  for (int k = kKinds - 1; k >= 0; --k) {
    if (mix[k] > 0) return static_cast<Kind>(k);
  }
  return Kind::prefill;
}

// ---- The shared decoder layer and the sessions.

struct Model {
  Sizes sz;
  DType kv;  // the sessions' cache dtype
  std::vector<float> wq, wk, wv, wo;
  std::vector<std::uint16_t> wq16, wk16, wv16, wo16;  // bf16 weights (llama); f32 ones freed
  std::unique_ptr<MultiHeadAttention> mha;
  Model(const Sizes& s, DType kv_dtype, std::uint64_t seed) : sz(s), kv(kv_dtype) {
    const std::int64_t dm = s.d_model(), hd = s.d_heads * s.d_dim, kvd = s.d_kv_heads * s.d_dim;
    wq.resize(dm * hd);
    wk.resize(dm * kvd);
    wv.resize(dm * kvd);
    wo.resize(hd * dm);
    fill(wq.data(), wq.size(), mix64(seed ^ 1));
    fill(wk.data(), wk.size(), mix64(seed ^ 2));
    fill(wv.data(), wv.size(), mix64(seed ^ 3));
    fill(wo.data(), wo.size(), mix64(seed ^ 4));
    // Weights of about 1/sqrt(fan-in) keep activations of order 1.
    const float a = 1.0f / std::sqrt(static_cast<float>(dm));
    for (auto* w : {&wq, &wk, &wv, &wo})
      for (float& x : *w) x *= a;
    MhaWeights w;
    const auto view = [&](std::vector<float>& f, std::vector<std::uint16_t>& b, std::int64_t rows,
                          std::int64_t cols) -> TensorView {
      if (!s.llama) return f32_view(f.data(), {rows, cols});
      b.resize(f.size());
      for (std::size_t i = 0; i < f.size(); ++i) b[i] = to_bf16(f[i]);
      std::vector<float>().swap(f);
      return TensorView::contiguous(b.data(), DType::bf16, {rows, cols});
    };
    w.wq = view(wq, wq16, dm, hd);
    w.wk = view(wk, wk16, dm, kvd);
    w.wv = view(wv, wv16, dm, kvd);
    w.wo = view(wo, wo16, hd, dm);
    MhaConfig config{.d_model = dm,
                     .heads = s.d_heads,
                     .kv_heads = s.d_kv_heads,
                     .head_dim = s.d_dim,
                     .value_dim = s.d_dim};
    if (s.llama) {
      config.rope = llama31_rope();
    }
    mha = std::make_unique<MultiHeadAttention>(config, w);
  }
};

struct Session {
  KvCache cache;
  std::int64_t steps = 0;  // decode requests served so far (the next request's step)
  std::int64_t epoch = 0;  // conversations so far: the cache is cleared when full
  std::atomic<int> busy{0};
  explicit Session(const Model& m) : cache(m.mha->make_cache(1, m.sz.d_max_len, false, m.kv)) {}
};

// Sessions checked out by one client at a time.
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) free_.push_back(i);
  }
  int checkout() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    const int s = free_.front();
    free_.pop_front();
    return s;
  }
  void checkin(int s) {
    {
      std::lock_guard lock(mu_);
      free_.push_back(s);
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> free_;
};

// ---- One request: inputs from its seed, one library call (timed), the hash of the output.

struct Buffers {
  std::vector<float> q, k, v, out;
  std::vector<std::int32_t> lens;
};

struct Outcome {
  std::int64_t tokens = 0;
  double ms = 0;
  std::uint64_t hash = 0;
  // decode only: where the step ran in its session
  std::int64_t epoch = -1, cached = -1;
};

template <class F>
double timed_ms(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Outcome run_prefill(const Sizes& sz, std::uint64_t rseed, Buffers& b, Context* ctx) {
  Rng rng{rseed};
  const std::int64_t L = rng.range(sz.p_len_min, sz.p_len_max), H = sz.p_heads, D = sz.p_dim;
  const std::int64_t n = L * H * D;
  b.q.resize(n), b.k.resize(n), b.v.resize(n), b.out.resize(n);
  fill(b.q.data(), n, rng.next());
  fill(b.k.data(), n, rng.next());
  fill(b.v.data(), n, rng.next());
  AttentionOptions o;
  o.causal = Causal::top_left;
  Outcome r;
  r.tokens = L;
  r.ms = timed_ms([&] {
    attention(TensorView::blhd(b.q.data(), DType::f32, 1, L, H, D),
              TensorView::blhd(b.k.data(), DType::f32, 1, L, H, D),
              TensorView::blhd(b.v.data(), DType::f32, 1, L, H, D),
              OutputView::blhd(b.out.data(), DType::f32, 1, L, H, D), o, ctx);
  });
  r.hash = hash_bits(b.out.data(), n);
  return r;
}

Outcome run_embed(const Sizes& sz, std::uint64_t rseed, Buffers& b, Context* ctx) {
  Rng rng{rseed};
  const std::int64_t B = sz.e_batch, H = sz.e_heads, D = sz.e_dim;
  const std::int64_t L = rng.range(sz.e_len_min, sz.e_len_max);
  const std::int64_t n = B * L * H * D;
  b.q.resize(n), b.k.resize(n), b.v.resize(n), b.out.resize(n);
  b.lens.resize(B);
  Outcome r;
  // The longest sequence sets L; the others are padded to it.
  for (std::int64_t i = 0; i < B; ++i) {
    b.lens[i] = static_cast<std::int32_t>(i == 0 ? L : rng.range(1, L));
    r.tokens += b.lens[i];
  }
  fill(b.q.data(), n, rng.next());
  fill(b.k.data(), n, rng.next());
  fill(b.v.data(), n, rng.next());
  AttentionOptions o;
  o.key_lengths = TensorView::contiguous(b.lens.data(), DType::i32, {B});
  r.ms = timed_ms([&] {
    attention(TensorView::blhd(b.q.data(), DType::f32, B, L, H, D),
              TensorView::blhd(b.k.data(), DType::f32, B, L, H, D),
              TensorView::blhd(b.v.data(), DType::f32, B, L, H, D),
              OutputView::blhd(b.out.data(), DType::f32, B, L, H, D), o, ctx);
  });
  r.hash = hash_bits(b.out.data(), n);
  return r;
}

// One decoding step of session `sid`: a new conversation (clear, then the prompt's K/V) when the
// cache is full or empty, then decode() of one token. The same code replays it serially.
Outcome run_decode(const Model& m, std::uint64_t seed, int sid, Session& s, std::uint64_t rseed,
                   Buffers& b, Context* ctx) {
  const Sizes& sz = m.sz;
  const std::int64_t dm = sz.d_model();
  if (s.cache.length() + 1 > sz.d_max_len) {
    s.cache.clear();
    ++s.epoch;
  }
  if (s.cache.length() == 0) {
    Rng rng{prompt_seed(seed, sid, s.epoch)};
    const std::int64_t P = rng.range(sz.d_prompt_min, sz.d_prompt_max);
    const std::int64_t n = sz.d_kv_heads * P * sz.d_dim;
    b.k.resize(n), b.v.resize(n);
    fill(b.k.data(), n, rng.next());
    fill(b.v.data(), n, rng.next());
    s.cache.append(f32_view(b.k.data(), {1, sz.d_kv_heads, P, sz.d_dim}),
                   f32_view(b.v.data(), {1, sz.d_kv_heads, P, sz.d_dim}));
  }
  b.q.resize(dm), b.out.resize(dm);
  fill(b.q.data(), dm, rseed);
  Outcome r;
  r.tokens = 1;
  r.epoch = s.epoch;
  r.cached = s.cache.length();
  r.ms = timed_ms([&] {
    m.mha->decode(f32_view(b.q.data(), {1, 1, dm}), s.cache, f32_view(b.out.data(), {1, 1, dm}), {},
                  ctx);
  });
  r.hash = hash_bits(b.out.data(), dm);
  return r;
}

// ---- Bookkeeping.

struct Record {
  std::uint64_t id = 0, rseed = 0;
  Kind kind = Kind::prefill;
  int session = -1;
  std::int64_t step = -1;
  Outcome out;
  int answers = 0;  // responses received for this request
  bool error = false;
  std::string error_text;
};

struct Failures {
  std::vector<std::string>& list;
  int max;
  void add(const std::string& msg) {
    if (static_cast<int>(list.size()) < max) list.push_back(msg);
  }
};

std::string describe(const Record& r) {
  std::string s = std::string(kind_name(r.kind)) + " request " + std::to_string(r.id >> 32) + ":" +
                  std::to_string(r.id & 0xffffffffu);
  if (r.kind == Kind::decode) {
    s += " (session " + std::to_string(r.session) + ", step " + std::to_string(r.step) + ")";
  }
  return s;
}

void fill_latency(KindStats& k, std::vector<double> ms, double wall_s) {
  k.requests = static_cast<std::int64_t>(ms.size());
  k.requests_per_s = wall_s > 0 ? k.requests / wall_s : 0;
  k.tokens_per_s = wall_s > 0 ? k.tokens / wall_s : 0;
  if (ms.empty()) return;
  std::sort(ms.begin(), ms.end());
  const auto rank = [&](double p) {  // nearest rank
    const auto i = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(ms.size())));
    return ms[std::min(ms.size(), std::max<std::size_t>(i, 1)) - 1];
  };
  double sum = 0;
  for (double x : ms) sum += x;
  k.mean_ms = sum / static_cast<double>(ms.size());
  k.p50_ms = rank(50);
  k.p99_ms = rank(99);
  k.max_ms = ms.back();
}

void validate(const ServeBenchOptions& o) {
  if (o.clients < 1) throw std::invalid_argument("serve-bench: clients must be >= 1");
  if (o.duration_s <= 0 && o.requests < 1) {
    throw std::invalid_argument("serve-bench: requests per client must be >= 1");
  }
  if (o.duration_s < 0 || !std::isfinite(o.duration_s)) {
    throw std::invalid_argument("serve-bench: the duration must be finite and >= 0");
  }
  double total = 0;
  for (double w : o.mix) {
    if (!(w >= 0) || !std::isfinite(w)) {
      throw std::invalid_argument("serve-bench: mix weights must be finite and >= 0");
    }
    total += w;
  }
  if (total <= 0) throw std::invalid_argument("serve-bench: the mix needs a weight > 0");
  if (o.threads < 0) throw std::invalid_argument("serve-bench: threads must be >= 0");
  if (o.sessions < 0) throw std::invalid_argument("serve-bench: sessions must be >= 0");
  DType kv = DType::f32;
  if (!o.kv_dtype.empty() && !(parse_dtype(o.kv_dtype, kv) && is_kv_dtype(kv))) {
    throw std::invalid_argument("serve-bench: kv_dtype '" + o.kv_dtype +
                                "' is not a K/V cache dtype (f32, bf16, f16, int8, ...)");
  }
}

// The decode sessions' cache dtype (validate() checked the name).
DType cache_dtype(const ServeBenchOptions& o) {
  DType kv = o.workload == Workload::llama ? DType::bf16 : DType::f32;
  if (!o.kv_dtype.empty()) parse_dtype(o.kv_dtype, kv);
  return kv;
}

const Sizes& sizes_of(const ServeBenchOptions& o) {
  if (o.workload == Workload::llama) return o.small ? kLlamaSmall : kLlama;
  return o.small ? kSmall : kFull;
}

// What the clients share: the model, its decode sessions and their pool, the context.
struct Shared {
  const ServeBenchOptions& o;
  const Sizes& sz;
  const Model& model;
  std::vector<std::unique_ptr<Session>>& sessions;
  Pool& pool;
  Context& ctx;
  std::atomic<std::int64_t>& busy_found;  // decode steps that found their session in use
};

// Serves request r (id, seed and kind set): a decode step checks a session out of the pool and
// back in, whatever happens. An exception becomes the record's error.
void serve(const Shared& sh, Record& r, Buffers& buf) {
  try {
    switch (r.kind) {
      case Kind::prefill:
        r.out = run_prefill(sh.sz, r.rseed, buf, &sh.ctx);
        break;
      case Kind::embed:
        r.out = run_embed(sh.sz, r.rseed, buf, &sh.ctx);
        break;
      case Kind::decode: {
        const int sid = sh.pool.checkout();
        Session& s = *sh.sessions[sid];
        if (s.busy.exchange(1) != 0) ++sh.busy_found;
        r.session = sid;
        r.step = s.steps++;
        try {
          r.out = run_decode(sh.model, sh.o.seed, sid, s, r.rseed, buf, &sh.ctx);
        } catch (...) {
          s.busy.store(0);
          sh.pool.checkin(sid);
          throw;
        }
        s.busy.store(0);
        sh.pool.checkin(sid);
        break;
      }
    }
  } catch (const std::exception& e) {
    r.error = true;
    r.error_text = e.what();
  }
}

// One client: its requests, one at a time, until its count or the deadline.
struct Client {
  std::vector<Record> records;
  std::int64_t sent = 0;
  Clock::time_point begin, end;
};

void run_client(const Shared& sh, int c, std::latch& start, Client& cl) {
  const ServeBenchOptions& o = sh.o;
  if (o.duration_s <= 0) cl.records.reserve(o.requests);
  Buffers buf;
  start.arrive_and_wait();
  cl.begin = Clock::now();
  const auto deadline = cl.begin + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o.duration_s));
  for (std::int64_t j = 0;; ++j) {
    if (o.duration_s > 0 ? Clock::now() >= deadline : j >= o.requests) break;
    Record r;
    r.id = request_id(c, j);
    r.rseed = request_seed(o.seed, r.id);
    r.kind = pick_kind(r.rseed, o.mix);
    ++cl.sent;
    serve(sh, r, buf);
    if (o.corrupt_one && c == 0 && j == 0) r.out.hash ^= 1;  // as if one output bit flipped
    ++r.answers;
    cl.records.push_back(std::move(r));
  }
  cl.end = Clock::now();
}

// Nothing lost: request j of client c is its records[j], answered exactly once, and every
// request sent has its record.
void check_answered(const ServeBenchOptions& o, const std::vector<Client>& clients,
                    ServeBenchResult& res, Failures& fails) {
  for (int c = 0; c < o.clients; ++c) {
    const std::vector<Record>& recs = clients[c].records;
    for (std::size_t j = 0; j < recs.size(); ++j) {
      const Record& r = recs[j];
      if (r.id != request_id(c, static_cast<std::int64_t>(j)) || r.answers != 1) {
        fails.add(describe(r) + ": answered " + std::to_string(r.answers) + " times at slot " +
                  std::to_string(j) + " of client " + std::to_string(c));
        ++res.lost;
      }
      if (r.error) {
        ++res.errors;
        fails.add(describe(r) + " failed: " + r.error_text);
      }
    }
    const auto answered = static_cast<std::int64_t>(recs.size());
    const std::int64_t sent = clients[c].sent;
    const std::int64_t expected = o.duration_s > 0 ? sent : o.requests;
    if (sent != answered || expected != answered) {
      fails.add("client " + std::to_string(c) + " sent " + std::to_string(sent) + " requests (" +
                std::to_string(expected) + " expected) and has " + std::to_string(answered) +
                " responses");
      res.lost += std::max(std::abs(sent - answered), std::abs(expected - answered));
    }
  }
}

// Sessions: never shared at once; each one's steps are 0, 1, 2, ... without gaps. Returns each
// session's decode records in step order.
std::vector<std::vector<const Record*>> check_sessions(const std::vector<Client>& clients,
                                                       std::int64_t busy_found,
                                                       ServeBenchResult& res, Failures& fails) {
  std::vector<std::vector<const Record*>> by_session(res.sessions);
  for (const Client& cl : clients)
    for (const Record& r : cl.records)
      if (r.kind == Kind::decode) by_session[r.session].push_back(&r);
  if (busy_found > 0) {
    res.session_errors += busy_found;
    fails.add(std::to_string(busy_found) +
              " decode request(s) found their session in use by another client");
  }
  for (int s = 0; s < res.sessions; ++s) {
    auto& v = by_session[s];
    std::sort(v.begin(), v.end(),
              [](const Record* a, const Record* b) { return a->step < b->step; });
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i]->step != static_cast<std::int64_t>(i)) {
        ++res.session_errors;
        fails.add("session " + std::to_string(s) + ": step " + std::to_string(v[i]->step) +
                  " where step " + std::to_string(i) + " was expected (a gap or a duplicate)");
        break;
      }
    }
  }
  return by_session;
}

// Latency and throughput per kind and over all kinds, from the requests that succeeded.
void add_statistics(const std::vector<Client>& clients, ServeBenchResult& res) {
  std::vector<double> lat[kKinds], all;
  for (const Client& cl : clients) {
    for (const Record& r : cl.records) {
      if (r.error) continue;
      const int k = static_cast<int>(r.kind);
      lat[k].push_back(r.out.ms);
      all.push_back(r.out.ms);
      res.kinds[k].tokens += r.out.tokens;
      res.all.tokens += r.out.tokens;
    }
  }
  for (int k = 0; k < kKinds; ++k) {
    res.kinds[k].kind = kind_name(static_cast<Kind>(k));
    fill_latency(res.kinds[k], std::move(lat[k]), res.wall_s);
  }
  res.all.kind = "all";
  fill_latency(res.all, std::move(all), res.wall_s);
}

// The serial recomputation: one thread, same target and provider, every request again (decode
// steps in their session's order, from an empty cache), bits compared.
void verify_serially(const Shared& sh, const std::vector<Client>& clients,
                     const std::vector<std::vector<const Record*>>& by_session,
                     ServeBenchResult& res, Failures& fails) {
  const auto t0 = Clock::now();
  Context serial(1);
  serial.set_max_target(sh.ctx.max_target());
  serial.set_simd(sh.ctx.simd());
  Buffers buf;
  const auto compare = [&](const Record& r, const Outcome& again) {
    const bool same = again.hash == r.out.hash && again.tokens == r.out.tokens &&
                      again.epoch == r.out.epoch && again.cached == r.out.cached;
    if (same) return;
    ++res.kinds[static_cast<int>(r.kind)].mismatches;
    ++res.all.mismatches;
    ++res.mismatches;
    std::string why = again.hash != r.out.hash ? "output bits differ" : "";
    if (again.epoch != r.out.epoch || again.cached != r.out.cached) {
      why += std::string(why.empty() ? "" : "; ") + "ran at conversation " +
             std::to_string(r.out.epoch) + " with " + std::to_string(r.out.cached) +
             " cached tokens, the serial replay at " + std::to_string(again.epoch) + " with " +
             std::to_string(again.cached);
    }
    fails.add(describe(r) + ": not equal to the serial recomputation: " + why);
  };
  for (const Client& cl : clients) {
    for (const Record& r : cl.records) {
      if (r.error || r.kind == Kind::decode) continue;
      compare(r, r.kind == Kind::prefill ? run_prefill(sh.sz, r.rseed, buf, &serial)
                                         : run_embed(sh.sz, r.rseed, buf, &serial));
    }
  }
  for (int sid = 0; sid < res.sessions; ++sid) {
    Session s(sh.model);
    for (const Record* r : by_session[sid]) {
      if (r->error) break;  // the cache after a failed step is not replayable
      compare(*r, run_decode(sh.model, sh.o.seed, sid, s, r->rseed, buf, &serial));
    }
  }
  res.verified = true;
  res.verify_s = std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

ServeBenchResult run_serve_bench(const ServeBenchOptions& o) {
  validate(o);
  const Sizes& sz = sizes_of(o);
  const DType kv = cache_dtype(o);
  ServeBenchResult res;
  res.clients = o.clients;
  res.workload = workload_name(o.workload);
  res.kv_dtype = dtype_short_name(kv);
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  res.sessions = o.sessions > 0 ? o.sessions : 2 * o.clients;
  Failures fails{res.failures, o.max_failures};

  // The shared context, with the default context's target cap and SIMD provider (so that
  // CPUATTN_TARGET and CPUATTN_SIMD apply).
  Context ctx(threads);
  ctx.set_max_target(default_context().max_target());
  ctx.set_simd(default_context().simd());
  res.threads = ctx.num_threads();
  res.target = target_name(active_target(&ctx));
  res.simd = simd_name(active_simd(&ctx));

  const Model model(sz, kv, o.seed);
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < res.sessions; ++i) sessions.push_back(std::make_unique<Session>(model));
  Pool pool(res.sessions);
  std::atomic<std::int64_t> busy_found{0};
  const Shared sh{o, sz, model, sessions, pool, ctx, busy_found};

  // The run: every client sends its requests, one at a time.
  std::vector<Client> clients(o.clients);
  {
    std::latch start(o.clients);
    std::vector<std::thread> ts;
    ts.reserve(o.clients);
    for (int c = 0; c < o.clients; ++c)
      ts.emplace_back([&, c] { run_client(sh, c, start, clients[c]); });
    for (auto& t : ts) t.join();
  }
  Clock::time_point first = clients[0].begin, last = clients[0].end;
  for (const Client& cl : clients) {
    first = std::min(first, cl.begin);
    last = std::max(last, cl.end);
  }
  res.wall_s = std::chrono::duration<double>(last - first).count();

  check_answered(o, clients, res, fails);
  const auto by_session = check_sessions(clients, busy_found.load(), res, fails);
  add_statistics(clients, res);
  if (o.verify) verify_serially(sh, clients, by_session, res, fails);
  return res;
}

}  // namespace cpuattn::serve
