// A service load test in one process: client threads send a mix of requests through ONE shared
// cpuattn::Context, and every response is checked afterwards against a serial recomputation.
//
// Request kinds:
//   prefill  attention() on a causal self-attention, B 1, H 8, D 64, L drawn from 16 ... 512
//   decode   one token of a decoding session: MultiHeadAttention::decode against the session's
//            own KvCache (8 heads, 2 K/V heads, D 64), which appends the token and attends with
//            bottom-right causal alignment. A session starts with a prompt of 16 ... 256 cached
//            tokens of its own and is cleared (a new conversation) when its cache is full.
//   embed    short bidirectional batches, B 8, H 12, L 32 ... 128, D 64, padded by key_lengths
// (the `small` scale shrinks every size for sanitizer builds and quick tests).
// The llama workload keeps the kinds and changes the shapes: decode runs a Llama-3-8B-shaped
// layer (d_model 4096, 32 query heads, 8 K/V heads of 128, Llama 3.1 rotary embedding, bf16
// weights) against sessions of 512 ... 3584 prompt tokens cleared at 4096; prefill is causal
// attention with 32 heads of 128 over 128 ... 1024 tokens; embed is as in the mix.
//
// Sessions live in one pool; a client checks a session out (mutex + condition variable), runs
// one step, and returns it, so a session moves between clients but is only ever used by one at a
// time (each session also carries a busy flag that a second user would find set).
//
// Every input is generated from (seed, request id) (the prompt from (seed, session, epoch)), so
// the check can regenerate it: after the run, each request is recomputed serially on a one-thread
// Context with the same target and SIMD provider (decode requests in their session's order, the
// cache replayed from empty), and the output's bits are compared with the hash of what the
// client received.
//
// Only the public cpuattn API and the standard library: builds under ThreadSanitizer without the
// CLI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cpuattn::serve {

enum class Kind : int { prefill = 0, decode = 1, embed = 2 };
enum class Workload : int { mix = 0, llama = 1 };
const char* workload_name(Workload workload);
inline constexpr int kKinds = 3;
const char* kind_name(Kind kind);

struct ServeBenchOptions {
  int clients = 8;                 // client threads, >= 1
  std::int64_t requests = 20;      // requests per client (ignored when duration_s > 0)
  double duration_s = 0;           // > 0: each client sends requests until this much time passed
  double mix[kKinds] = {1, 4, 2};  // relative weights of prefill, decode, embed (>= 0, sum > 0)
  bool small = false;              // small sizes (sanitizers, tests)
  Workload workload = Workload::mix;
  // The decode sessions' cache dtype (a K/V dtype name of cpuattn.h: f32, bf16, f16, int8, ...);
  // empty: f32 for the mix, bf16 for llama.
  std::string kv_dtype;
  std::uint64_t seed = 1;
  int threads = 0;       // threads of the shared Context; 0: the machine's logical CPUs
  int sessions = 0;      // decode sessions in the pool; 0: 2 per client
  bool verify = true;    // recompute every request serially and compare bits
  int max_failures = 8;  // failure messages kept (the counts are always complete)
  // For the checker's own test: alter what client 0 received for its first request (as a
  // corrupted response would be); the check must then fail.
  bool corrupt_one = false;
};

struct KindStats {
  std::string kind;  // "prefill", "decode", "embed" or "all"
  std::int64_t requests = 0, tokens = 0;
  double requests_per_s = 0, tokens_per_s = 0;
  double mean_ms = 0, p50_ms = 0, p99_ms = 0, max_ms = 0;  // latency of one library call
  std::int64_t mismatches = 0;                             // not bitwise equal to the serial run
};

struct ServeBenchResult {
  int clients = 0, threads = 0, sessions = 0;
  std::string target, simd;  // what the shared context ran
  std::string workload, kv_dtype;
  double wall_s = 0;  // first request sent ... last response received
  KindStats kinds[kKinds];
  KindStats all;
  // Checks. `lost`: requests sent without exactly one response; `session_errors`: a session
  // found busy at checkout or a gap/duplicate in a session's step order; `errors`: requests that
  // threw.
  bool verified = false;  // the serial recomputation ran
  double verify_s = 0;
  std::int64_t lost = 0, session_errors = 0, errors = 0, mismatches = 0;
  std::vector<std::string> failures;  // the first max_failures messages
  bool ok() const { return lost == 0 && session_errors == 0 && errors == 0 && mismatches == 0; }
};

// Throws std::invalid_argument on bad options.
ServeBenchResult run_serve_bench(const ServeBenchOptions& options);

}  // namespace cpuattn::serve
