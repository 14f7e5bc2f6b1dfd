// `cpuattn run`: attention on .npy files.
//
// Inputs of rank 2 [L, D], 3 [B, L, D] or 4 [B, H, L, D] are viewed as rank 4 without copying
// (rank 2 as [1, 1, L, D], rank 3 as [B, 1, L, D]); outputs keep the rank of Q. Everything is
// computed in memory before anything is written, and every file is written atomically, OUT last,
// so a failed run leaves no OUT behind.
#include <sys/stat.h>
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "cpuattn/cpuattn.h"
#include "npy.h"

namespace cpuattn::cli {
namespace {

struct RunArgs {
  std::string q, k, v, out;
  std::string mask, key_lengths, lse, weights;
  double scale = 0, temperature = 0;
  bool no_scale = false;
  int threads = 0;
  bool reference = false;
  // Set after parsing: whether the option was given.
  CLI::Option* scale_opt = nullptr;
  CLI::Option* temperature_opt = nullptr;
};

// Bad input found by this command (the library and npy throw their own errors).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& message) { throw BadInput(message); }

// "Q (q.npy)" for messages.
std::string named(const char* what, const std::string& path) {
  return std::string(what) + " (" + path + ")";
}

// Reads Q, K or V: float32/float64, rank 2..4, no empty dimension. Converted to float32 unless
// `keep_f64` (the reference takes float64 as is).
npy::Array load_qkv(const char* what, const std::string& path, bool keep_f64) {
  npy::Array a = npy::read(path);
  if (a.dtype != DType::f32 && a.dtype != DType::f64) {
    fail(named(what, path) + " has dtype " + dtype_name(a.dtype) + "; expected float32 or float64");
  }
  if (a.rank() < 2 || a.rank() > 4) {
    fail(named(what, path) + " has shape " + npy::shape_str(a.shape) +
         "; expected rank 2 [L, D], 3 [B, L, D] or 4 [B, H, L, D]");
  }
  for (std::int64_t d : a.shape) {
    if (d < 1) {
      fail(named(what, path) + " has shape " + npy::shape_str(a.shape) +
           "; every dimension must be at least 1");
    }
  }
  if (a.dtype == DType::f64 && !keep_f64) a = npy::to_f32(a);
  return a;
}

// A view of rank `rank` whose dimension positions[i] is dimension i of `t`; the other dimensions
// have size 1 (with the stride a contiguous layout would give them).
template <class View>
View place(const View& t, int rank, std::initializer_list<int> positions) {
  View r;
  r.data = t.data;
  r.dtype = t.dtype;
  r.rank = rank;
  bool filled[kMaxRank] = {};
  int i = 0;
  for (int p : positions) {
    r.shape[p] = t.shape[i];
    r.strides[p] = t.strides[i];
    filled[p] = true;
    ++i;
  }
  for (int d = rank - 1; d >= 0; --d) {
    if (filled[d]) continue;
    r.shape[d] = 1;
    r.strides[d] = d + 1 < rank ? r.strides[d + 1] * r.shape[d + 1] : 1;
  }
  return r;
}

// [.., L, X] of rank 2..4 as [B, H, L, X].
template <class View>
View as_bhlx(const View& t) {
  if (t.rank == 2) return place(t, 4, {2, 3});
  if (t.rank == 3) return place(t, 4, {0, 2, 3});
  return t;
}

// [.., Lq] of rank 1..3 (Q's rank minus one) as [B, H, Lq].
template <class View>
View as_bhl(const View& t) {
  if (t.rank == 1) return place(t, 3, {2});
  if (t.rank == 2) return place(t, 3, {0, 2});
  return t;
}

std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

// The library's messages start with "cpuattn: "; ours are printed with that prefix added once.
void report(std::string message) {
  const std::string prefix = "cpuattn: ";
  while (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "cpuattn: %s\n", message.c_str());
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void run(const RunArgs& a) {
  // ---- Options that need no file.
  AttentionOptions opts;
  if (a.scale_opt->count() > 0) {
    if (!std::isfinite(a.scale) || a.scale <= 0) {
      fail("--scale must be finite and > 0, got " + a.scale_opt->as<std::string>());
    }
    opts.scale = a.scale;
  } else if (a.temperature_opt->count() > 0) {
    const double s = 1.0 / a.temperature;
    if (!std::isfinite(a.temperature) || a.temperature <= 0 || !std::isfinite(s)) {
      fail("--temperature must be finite and > 0 (scale = 1/T), got " +
           a.temperature_opt->as<std::string>());
    }
    opts.scale = s;
  } else if (a.no_scale) {
    opts.scale = 1.0;
  }
  const bool mask_is_file =
      !a.mask.empty() && a.mask != "causal" && a.mask != "causal-bottom-right";
  if (a.mask == "causal") opts.causal = Causal::top_left;
  if (a.mask == "causal-bottom-right") opts.causal = Causal::bottom_right;
  if (mask_is_file && !path_exists(a.mask)) {
    fail("--mask must be 'causal', 'causal-bottom-right' or an existing .npy file; got '" + a.mask +
         "'");
  }
  const std::vector<std::pair<const char*, const std::string*>> outputs = {
      {"--out", &a.out}, {"--lse", &a.lse}, {"--weights", &a.weights}};
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = i + 1; j < outputs.size(); ++j) {
      if (!outputs[i].second->empty() && *outputs[i].second == *outputs[j].second) {
        fail(std::string(outputs[i].first) + " and " + outputs[j].first + " name the same file '" +
             *outputs[i].second + "'");
      }
    }
  }

  // ---- Inputs.
  const npy::Array q = load_qkv("Q", a.q, a.reference);
  const npy::Array k = load_qkv("K", a.k, a.reference);
  const npy::Array v = load_qkv("V", a.v, a.reference);
  const int rank = q.rank();
  if (k.rank() != rank || v.rank() != rank) {
    fail("Q, K and V must have the same rank; got Q " + npy::shape_str(q.shape) + ", K " +
         npy::shape_str(k.shape) + ", V " + npy::shape_str(v.shape));
  }
  const std::int64_t Lk = k.shape[rank - 2];
  // The scores in the inputs' rank: Q's shape with Lk last.
  const std::vector<std::int64_t> scores_shape = with_last(q.shape, Lk);

  npy::Array mask;
  if (mask_is_file) {
    mask = npy::read(a.mask);
    if (mask.dtype == DType::f64) mask = npy::to_f32(mask);
    if (mask.dtype != DType::boolean && mask.dtype != DType::f32) {
      fail(named("mask", a.mask) + " has dtype " + dtype_name(mask.dtype) +
           "; expected bool (true = attend) or float32/float64 (added to the scores)");
    }
    if (mask.rank() < 1 || mask.rank() > rank) {
      fail(named("mask", a.mask) + " has shape " + npy::shape_str(mask.shape) +
           "; expected rank 1.." + std::to_string(rank) + ", broadcastable to the scores " +
           npy::shape_str(scores_shape));
    }
    // NumPy broadcasting in the inputs' rank: align trailing dimensions.
    const std::vector<std::int64_t> given = mask.shape;
    mask.shape.insert(mask.shape.begin(), static_cast<std::size_t>(rank - mask.rank()), 1);
    for (int d = 0; d < rank; ++d) {
      if (mask.shape[d] != 1 && mask.shape[d] != scores_shape[d]) {
        fail(named("mask", a.mask) + " of shape " + npy::shape_str(given) +
             " does not broadcast to the scores " + npy::shape_str(scores_shape) +
             " (Q's shape with Lk last)");
      }
    }
    opts.mask = as_bhlx(npy::input_view(mask));
  }

  npy::Array key_lengths;
  if (!a.key_lengths.empty()) {
    key_lengths = npy::read(a.key_lengths);
    if (key_lengths.dtype != DType::i32 && key_lengths.dtype != DType::i64) {
      fail(named("key lengths", a.key_lengths) + " has dtype " + dtype_name(key_lengths.dtype) +
           "; expected int32 or int64");
    }
    const std::int64_t B = rank == 2 ? 1 : q.shape[0];
    if (key_lengths.rank() != 1 || key_lengths.shape[0] != B) {
      fail(named("key lengths", a.key_lengths) + " has shape " + npy::shape_str(key_lengths.shape) +
           "; expected (" + std::to_string(B) + ",), one length per batch" +
           (rank == 2 ? " (rank-2 inputs are one batch)" : ""));
    }
    opts.key_lengths = npy::input_view(key_lengths);
  }

  // ---- Outputs, in memory.
  npy::Array out = npy::zeros(DType::f32, with_last(q.shape, v.shape.back()));
  npy::Array lse, weights;
  if (!a.lse.empty()) {
    lse = npy::zeros(DType::f32, std::vector<std::int64_t>(q.shape.begin(), q.shape.end() - 1));
    opts.lse = as_bhl(npy::output_view(lse));
  }
  if (!a.weights.empty()) {
    weights = npy::zeros(DType::f32, scores_shape);
    opts.weights = as_bhlx(npy::output_view(weights));
  }

  const TensorView qv = as_bhlx(npy::input_view(q));
  const TensorView kv = as_bhlx(npy::input_view(k));
  const TensorView vv = as_bhlx(npy::input_view(v));
  const OutputView ov = as_bhlx(npy::output_view(out));
  if (a.reference) {
    if (a.threads > 0) {
      tbb::task_arena arena(a.threads);
      arena.execute([&] { reference_attention(qv, kv, vv, ov, opts); });
    } else {
      reference_attention(qv, kv, vv, ov, opts);
    }
  } else {
    // An owned context (0 = the caller's arena, like the default one) with the default context's
    // target, so that CPUATTN_TARGET still applies. Owning it frees its scratch memory at exit;
    // the never-destroyed default context shows up as a leak under LeakSanitizer.
    Context context(a.threads);
    context.set_max_target(active_target());
    attention(qv, kv, vv, ov, opts, &context);
  }

  // ---- Files: OUT last, so that OUT exists only if every output was written.
  if (!a.weights.empty()) npy::write(a.weights, weights);
  if (!a.lse.empty()) npy::write(a.lse, lse);
  npy::write(a.out, out);
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Run attention on .npy files: OUT = softmax(scale * Q K^T + mask) V");
  cmd->add_option("--q", args->q, "Queries [.., Lq, D] (.npy, float32 or float64)")
      ->required()
      ->type_name("Q.npy");
  cmd->add_option("--k", args->k, "Keys [.., Lk, D], same rank as Q")
      ->required()
      ->type_name("K.npy");
  cmd->add_option("--v", args->v, "Values [.., Lk, Dv], same rank as Q")
      ->required()
      ->type_name("V.npy");
  cmd->add_option("--out", args->out,
                  "Output [.., Lq, Dv], float32. Written atomically and only if the run succeeds")
      ->required()
      ->type_name("OUT.npy");
  cmd->add_option("--mask", args->mask,
                  "'causal' (query i sees keys j <= i), 'causal-bottom-right' (query i sees keys "
                  "j <= i + Lk - Lq, for KV-cache decoding), or a .npy mask broadcastable (NumPy "
                  "rules) to the scores [.., Lq, Lk]: bool (true = may attend) or float32/float64 "
                  "(added to the scaled scores, e.g. -inf or -1e9 to block)")
      ->type_name("causal|causal-bottom-right|MASK.npy");
  cmd->add_option("--key-lengths", args->key_lengths,
                  "int32/int64 .npy of shape [B]: in batch b only keys 0..len[b]-1 are attended "
                  "(padded batches). Rank-2 inputs are one batch")
      ->type_name("LEN.npy");
  auto* scale = cmd->add_option("--scale", args->scale,
                                "Multiply Q K^T by S (finite, > 0). Default 1/sqrt(D)")
                    ->type_name("S");
  auto* temperature =
      cmd->add_option("--temperature", args->temperature,
                      "Softmax temperature T (finite, > 0): scale = 1/T. Small T approaches argmax")
          ->type_name("T");
  auto* no_scale = cmd->add_flag("--no-scale", args->no_scale, "Scale 1: plain softmax(Q K^T)");
  scale->excludes(temperature);
  scale->excludes(no_scale);
  temperature->excludes(no_scale);
  args->scale_opt = scale;
  args->temperature_opt = temperature;
  cmd->add_option("--lse", args->lse,
                  "Also write the log-sum-exp of each row's scaled, masked scores [.., Lq] "
                  "(float32; -inf for a fully masked row)")
      ->type_name("LSE.npy");
  cmd->add_option("--weights", args->weights,
                  "Also write the attention weights softmax(scale * Q K^T + mask) [.., Lq, Lk] "
                  "(float32)")
      ->type_name("W.npy");
  cmd->add_option("--threads", args->threads,
                  "Run on exactly N threads (default: all cores). Results do not depend on N")
      ->check(CLI::Range(1, 1 << 16))
      ->type_name("N");
  cmd->add_flag("--reference", args->reference,
                "Use the slow double-precision reference implementation instead of the fast "
                "path (float64 inputs are used as is)");
  cmd->footer(
      "Q, K and V have the same rank: 2 [L, D], 3 [B, L, D] or 4 [B, H, L, D]. With rank 4, K and "
      "V may have fewer heads than Q (grouped-query attention). V's last dimension Dv may differ "
      "from D. Inputs are float32 or float64; the fast path computes in float32, --reference in "
      "float64. Outputs are float32 and keep Q's rank.\n"
      "Exit status: 0 on success, 2 on bad input (message on stderr; OUT is not written).\n"
      "Examples:\n"
      "  cpuattn run --q q.npy --k k.npy --v v.npy --out out.npy --mask causal\n"
      "  cpuattn run --q q.npy --k k.npy --v v.npy --out out.npy --mask mask.npy \\\n"
      "      --no-scale --weights w.npy --lse lse.npy --threads 4\n"
      "In NumPy: np.save('q.npy', q.astype(np.float32)); out = np.load('out.npy')");
  cmd->callback([args, &exit_code] {
    try {
      run(*args);
      exit_code = 0;
    } catch (const std::bad_alloc&) {
      report("out of memory");
      exit_code = 2;
    } catch (const std::exception& e) {  // cpuattn::Error, npy::Error, BadInput
      report(e.what());
      exit_code = 2;
    }
  });
}

}  // namespace cpuattn::cli
