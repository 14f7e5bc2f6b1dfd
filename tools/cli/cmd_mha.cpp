// `cpuattn mha`: a multi-head attention layer (cpuattn/layers.h) on .npy files: self-attention,
// causal self-attention, cross attention, or incremental decoding through a KV cache.
//
// X of rank 2 [L, d_model] is one batch; the outputs then have no batch axis either. Everything
// is computed in memory before anything is written, OUT last, each file atomically.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cases.h"
#include "cli_util.h"
#include "commands.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "files.h"
#include "npy.h"

namespace cpuattn::cli {
namespace {

struct MhaArgs {
  std::string x, xkv, wq, wk, wv, wo, bq, bk, bv, bo, key_lengths, out, weights;
  std::int64_t heads = 0, kv_heads = 0, decode_steps = 0;
  std::string cache_dtype = "f32";
  bool causal = false;
  int threads = 0;
  std::string simd;
};

// The key lengths as int64 values.
std::vector<std::int64_t> lengths_of(const npy::Array& a) {
  if (a.dtype == DType::i64) return npy::values<std::int64_t>(a);
  const std::vector<std::int32_t> v = npy::values<std::int32_t>(a);
  return {v.begin(), v.end()};
}

// Rows [start, start + n) of a [B, L, F] view.
template <class View>
View rows(View t, std::int64_t start, std::int64_t n) {
  using Elem = std::conditional_t<std::is_same_v<View, TensorView>, const float, float>;
  t.data = static_cast<Elem*>(t.data) + start * t.strides[1];
  t.shape[1] = n;
  return t;
}

// Feeds x through a KV cache `steps` tokens at a time: the causal pass, incrementally. Weights
// [B, H, L, L] get each step's rows [.., n, cached length] (the rest stays 0, as causal).
void decode_all(const MultiHeadAttention& mha, const TensorView& x, const OutputView& out,
                const npy::Array* key_lengths, const std::optional<OutputView>& weights,
                std::int64_t steps, DType cache_dtype, Context* context) {
  const std::int64_t B = x.shape[0], L = x.shape[1];
  std::vector<std::int64_t> lengths, clamped(static_cast<std::size_t>(B));
  if (key_lengths != nullptr) {
    lengths = lengths_of(*key_lengths);
    for (std::int64_t b = 0; b < B; ++b) {
      if (lengths[b] < 0 || lengths[b] > L) {
        fail("key lengths: entry " + std::to_string(b) + " is " + std::to_string(lengths[b]) +
             "; every length must be in [0, " + std::to_string(L) + "] (L of X)");
      }
    }
  }
  KvCache cache = mha.make_cache(B, L, false, cache_dtype);
  for (std::int64_t start = 0; start < L; start += steps) {
    const std::int64_t n = std::min(steps, L - start), cached = start + n;
    AttentionOptions opts;
    if (key_lengths != nullptr) {
      // Lengths beyond the cache so far mask nothing yet.
      for (std::int64_t b = 0; b < B; ++b) clamped[b] = std::min(lengths[b], cached);
      opts.key_lengths = TensorView::contiguous(clamped.data(), DType::i64, {B});
    }
    if (weights) {
      OutputView w = *weights;  // [B, H, L, L]: rows start.., columns 0..cached-1
      w.data = static_cast<float*>(w.data) + start * w.strides[2];
      w.shape[2] = n;
      w.shape[3] = cached;
      opts.weights = w;
    }
    mha.decode(rows(x, start, n), cache, rows(out, start, n), opts, context);
  }
}

void run(const MhaArgs& a) {
  if (a.out.empty() && a.weights.empty()) {
    fail("give --out and/or --weights: otherwise nothing would be written");
  }
  if (a.cache_dtype != "f32" && a.decode_steps == 0) {
    fail("--cache-dtype " + a.cache_dtype +
         " needs --decode-steps (the KV cache only exists then)");
  }
  if (a.decode_steps > 0 && !a.xkv.empty()) {
    fail(
        "--decode-steps decodes self-attention through a KV cache; it cannot be combined with "
        "--xkv (cross attention)");
  }
  check_files({{"--out", a.out}, {"--weights", a.weights}}, {{"--x", a.x},
                                                             {"--xkv", a.xkv},
                                                             {"--wq", a.wq},
                                                             {"--wk", a.wk},
                                                             {"--wv", a.wv},
                                                             {"--wo", a.wo},
                                                             {"--bq", a.bq},
                                                             {"--bk", a.bk},
                                                             {"--bv", a.bv},
                                                             {"--bo", a.bo},
                                                             {"--key-lengths", a.key_lengths}});

  // ---- Inputs.
  const char* const tokens = "rank 2 [L, d_model] or 3 [B, L, d_model]";
  const npy::Array x = load_float("X", a.x, 2, 3, tokens);
  npy::Array xkv;
  if (!a.xkv.empty()) {
    xkv = load_float("XKV", a.xkv, 2, 3, tokens);
    if (xkv.rank() != x.rank()) {
      fail("X and XKV must have the same rank; got X " + npy::shape_str(x.shape) + ", XKV " +
           npy::shape_str(xkv.shape));
    }
  }
  const int rank = x.rank();
  const bool unbatched = rank == 2;
  const std::int64_t B = unbatched ? 1 : x.shape[0], Lq = x.shape[rank - 2];
  const std::int64_t Lk = a.xkv.empty() ? Lq : xkv.shape[rank - 2];

  // ---- The layer (its constructor checks every weight's shape).
  const npy::Array wq = load_float("WQ", a.wq, 2, 2, "rank 2 [d_model, heads * head_dim]");
  const npy::Array wk = load_float("WK", a.wk, 2, 2, "rank 2 [d_model, kv_heads * head_dim]");
  const npy::Array wv = load_float("WV", a.wv, 2, 2, "rank 2 [d_model, kv_heads * value_dim]");
  const npy::Array wo = load_float("WO", a.wo, 2, 2, "rank 2 [heads * value_dim, d_model]");
  MhaConfig config;
  config.d_model = x.shape.back();
  config.heads = a.heads;
  config.kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  if (wq.shape[1] % a.heads != 0) {
    fail(named("WQ", a.wq) + " has shape " + npy::shape_str(wq.shape) + "; its " +
         std::to_string(wq.shape[1]) + " columns must be heads * head_dim, a multiple of --heads " +
         std::to_string(a.heads));
  }
  if (wo.shape[0] % a.heads != 0) {
    fail(named("WO", a.wo) + " has shape " + npy::shape_str(wo.shape) + "; its " +
         std::to_string(wo.shape[0]) + " rows must be heads * value_dim, a multiple of --heads " +
         std::to_string(a.heads));
  }
  if (a.heads % config.kv_heads != 0) {
    fail("--heads " + std::to_string(a.heads) + " must be a multiple of --kv-heads " +
         std::to_string(config.kv_heads));
  }
  config.head_dim = wq.shape[1] / a.heads;
  config.value_dim = wo.shape[0] / a.heads;
  MhaWeights mw{.wq = npy::input_view(wq),
                .wk = npy::input_view(wk),
                .wv = npy::input_view(wv),
                .wo = npy::input_view(wo)};
  const struct {
    const char* what;
    const std::string& path;
    std::optional<TensorView>& view;
  } bias_files[] = {
      {"bq", a.bq, mw.bq}, {"bk", a.bk, mw.bk}, {"bv", a.bv, mw.bv}, {"bo", a.bo, mw.bo}};
  npy::Array biases[4];
  for (int i = 0; i < 4; ++i) {
    if (bias_files[i].path.empty()) continue;
    biases[i] = load_float(bias_files[i].what, bias_files[i].path, 1, 1, "rank 1 [out]");
    bias_files[i].view = npy::input_view(biases[i]);
  }
  std::optional<MultiHeadAttention> layer;
  try {
    layer.emplace(config, mw);  // copies the weights
  } catch (const Error& e) {
    // The library names the weight and its expected shape; add where the sizes come from.
    std::string message = e.what();
    if (message.rfind("cpuattn: ", 0) == 0) message.erase(0, 9);
    fail(message + " (d_model " + std::to_string(config.d_model) + " from X, heads " +
         std::to_string(config.heads) + ", kv_heads " + std::to_string(config.kv_heads) +
         ", head_dim " + std::to_string(config.head_dim) + " = WQ columns / heads, value_dim " +
         std::to_string(config.value_dim) + " = WO rows / heads)");
  }
  const MultiHeadAttention& mha = *layer;

  AttentionOptions opts;
  if (a.causal) opts.causal = Causal::top_left;
  npy::Array key_lengths;
  if (!a.key_lengths.empty()) {
    key_lengths = load_key_lengths(a.key_lengths, B, unbatched);
    opts.key_lengths = npy::input_view(key_lengths);
  }

  // ---- Outputs, in memory.
  npy::Array out = npy::zeros(DType::f32, x.shape);
  npy::Array weights;
  if (!a.weights.empty()) {
    std::vector<std::int64_t> shape = {B, a.heads, Lq, Lk};
    if (unbatched) shape.erase(shape.begin());
    weights = npy::zeros(DType::f32, shape);
    const OutputView wv4 = npy::output_view(weights);
    opts.weights = unbatched ? place(wv4, 4, {1, 2, 3}) : wv4;
  }
  const TensorView xv = as_blx(npy::input_view(x));
  const OutputView ov = as_blx(npy::output_view(out));
  const std::unique_ptr<Context> context = make_context(a.threads, a.simd);
  if (a.decode_steps > 0) {
    decode_all(mha, xv, ov, a.key_lengths.empty() ? nullptr : &key_lengths, opts.weights,
               a.decode_steps, parse_dtype(a.cache_dtype, "--cache-dtype", true), context.get());
  } else if (!a.xkv.empty()) {
    mha.forward_cross(xv, as_blx(npy::input_view(xkv)), ov, opts, context.get());
  } else {
    mha.forward(xv, ov, opts, context.get());
  }

  // ---- Files: committed together.
  files::OutputFiles outputs;
  if (!a.weights.empty()) outputs.stage(a.weights, npy::as_bytes(a.weights, weights));
  if (!a.out.empty()) outputs.stage(a.out, npy::as_bytes(a.out, out));
  outputs.commit();
}

}  // namespace

void add_mha_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<MhaArgs>();
  CLI::App* cmd = app.add_subcommand(
      "mha",
      "Run a multi-head attention layer on .npy files: OUT = concat_h(attention(X Wq_h, X' Wk_h, "
      "X' Wv_h)) Wo + bo, with X' = XKV (cross attention) or X (self-attention)");
  cmd->add_option("--x", args->x, "Tokens [B, L, d_model] or [L, d_model] (float32 or float64)")
      ->required()
      ->type_name("X.npy");
  cmd->add_option("--xkv", args->xkv,
                  "Cross attention: keys and values from XKV [B, Lk, d_model] (same rank as X)")
      ->type_name("XKV.npy");
  cmd->add_option("--wq", args->wq, "Wq [d_model, heads * head_dim] (y = x W)")
      ->required()
      ->type_name("WQ.npy");
  cmd->add_option("--wk", args->wk, "Wk [d_model, kv_heads * head_dim]")
      ->required()
      ->type_name("WK.npy");
  cmd->add_option("--wv", args->wv, "Wv [d_model, kv_heads * value_dim]")
      ->required()
      ->type_name("WV.npy");
  cmd->add_option("--wo", args->wo, "Wo [heads * value_dim, d_model]")
      ->required()
      ->type_name("WO.npy");
  cmd->add_option("--bq", args->bq, "Bias of the Q projection [heads * head_dim]")
      ->type_name("BQ.npy");
  cmd->add_option("--bk", args->bk, "Bias of the K projection [kv_heads * head_dim]")
      ->type_name("BK.npy");
  cmd->add_option("--bv", args->bv, "Bias of the V projection [kv_heads * value_dim]")
      ->type_name("BV.npy");
  cmd->add_option("--bo", args->bo, "Bias of the output projection [d_model]")->type_name("BO.npy");
  cmd->add_option("--heads", args->heads,
                  "Query heads H: head_dim = columns of Wq / H, value_dim = rows of Wo / H")
      ->required()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->type_name("H");
  cmd->add_option("--kv-heads", args->kv_heads,
                  "Key/value heads (default H; H must be a multiple: grouped-query attention)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->type_name("HKV");
  cmd->add_flag("--causal", args->causal, "Causal self-attention: token i attends tokens j <= i");
  cmd->add_option("--decode-steps", args->decode_steps,
                  "Instead of one pass, feed X through a KV cache N tokens at a "
                  "time (causal by construction; equals the --causal pass)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->type_name("N");
  cmd->add_option("--cache-dtype", args->cache_dtype,
                  "With --decode-steps: store the KV cache as one of " + dtype_choices(true) +
                      " (scaled dtypes with per-token scales; default f32)")
      ->check(CLI::IsMember(dtype_names(true)));
  cmd->add_option("--key-lengths", args->key_lengths,
                  "int32/int64 .npy of shape [B]: in batch b only keys 0..len[b]-1 are attended")
      ->type_name("LEN.npy");
  cmd->add_option("--out", args->out, "Output [B, L, d_model] (float32, X's rank)")
      ->type_name("OUT.npy");
  cmd->add_option("--weights", args->weights,
                  "Also write the attention weights [B, H, Lq, Lk] (float32; [H, Lq, Lk] for "
                  "rank-2 X)")
      ->type_name("W.npy");
  add_threads_option(*cmd, args->threads);
  add_simd_option(*cmd, args->simd);
  cmd->footer(
      "Inputs are float32 or float64 (converted to float32). Exit status: 0 on success, 2 on bad "
      "input (message on stderr; no output is written).\n"
      "Examples:\n"
      "  cpuattn mha --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 \\\n"
      "      --causal --out out.npy\n"
      "  cpuattn mha --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 \\\n"
      "      --decode-steps 1 --out out_inc.npy   # equals the --causal pass\n"
      "  cpuattn mha --x dec.npy --xkv enc.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy \\\n"
      "      --heads 4 --kv-heads 2 --out out.npy --weights w.npy");
  cmd->callback([args, &exit_code] { guarded(exit_code, [&] { run(*args); }); });
}

}  // namespace cpuattn::cli
