// `cpuattn run`: attention on .npy files.
//
// --kind sdpa (the default): scaled dot-product attention. Inputs of rank 2 [L, D], 3 [B, L, D]
// or 4 [B, H, L, D] are viewed as rank 4 without copying (rank 2 as [1, 1, L, D], rank 3 as
// [B, 1, L, D]); outputs keep the rank of Q.
// --kind additive / multiplicative: Bahdanau / Luong attention of decoder states H over encoder
// states S (cpuattn/layers.h). Inputs of rank 2 [L, F] are one batch; outputs keep H's rank.
//
// Everything is computed in memory before anything is written; then every output is staged and
// all are committed together (files.h), so a failed run writes none of them.
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "files.h"
#include "npy.h"

namespace cpuattn::cli {
namespace {

enum Kind : unsigned { kSdpa = 1, kAdditive = 2, kMultiplicative = 4 };

const char* kind_name(unsigned kind) {
  switch (kind) {
    case kSdpa:
      return "sdpa";
    case kAdditive:
      return "additive";
    case kMultiplicative:
      return "multiplicative";
    default:
      return "additive or multiplicative";
  }
}

// An option that belongs to some kinds only: given with another kind it is an error.
struct KindOption {
  std::string name;  // "--w1"
  CLI::Option* option;
  unsigned allowed;   // Kind bits
  unsigned required;  // Kind bits
};

struct RunArgs {
  std::string kind = "sdpa";
  std::string q, k, v, out;
  std::string mask, key_lengths, lse, weights;
  std::string h, s, values, w1, w2, va, b1, b2, w;
  double scale = 0, temperature = 0;
  bool no_scale = false, unscaled = false;
  int threads = 0;
  std::string simd;
  bool reference = false;
  std::string dtype;  // "", f32, bf16, f16: the dtype Q, K and V are converted to
  // Variants (sdpa): "LEFT,RIGHT", soft-cap, default ALiBi slopes, slope and sink files.
  std::string window, alibi_slopes, sinks;
  std::string cu_q, cu_k;  // packed variable-length batches
  double softcap = 0;
  bool alibi = false;
  // Set after parsing: whether the option was given.
  CLI::Option* scale_opt = nullptr;
  CLI::Option* temperature_opt = nullptr;
  CLI::Option* softcap_opt = nullptr;
  std::vector<KindOption> kind_options;
};

bool is_causal_keyword(const std::string& mask) {
  return mask == "causal" || mask == "causal-bottom-right";
}

// Options given for the wrong kind, and required options missing for this kind.
void check_kind_options(const RunArgs& a, unsigned kind) {
  for (const KindOption& o : a.kind_options) {
    if (o.option->count() > 0 && (o.allowed & kind) == 0) {
      fail(o.name + " is not an option of --kind " + kind_name(kind) + " (it is for --kind " +
           kind_name(o.allowed) + ")");
    }
  }
  for (const KindOption& o : a.kind_options) {
    if (o.option->count() == 0 && (o.required & kind) != 0) {
      fail("--kind " + std::string(kind_name(kind)) + " requires " + o.name);
    }
  }
}

bool mask_is_file(const RunArgs& a) { return !a.mask.empty() && !is_causal_keyword(a.mask); }

// The options that need no file (scale, causal mask, window, soft-cap, ALiBi), after checking
// them and which files exist.
AttentionOptions sdpa_options(const RunArgs& a) {
  AttentionOptions opts;
  if (a.scale_opt->count() > 0) {
    if (!(a.scale >= kMinScale && a.scale <= kMaxScale)) {
      fail("--scale must be in [1.18e-38, 2.36e38] (finite, > 0, representable in float32), got " +
           a.scale_opt->as<std::string>());
    }
    opts.scale = a.scale;
  } else if (a.temperature_opt->count() > 0) {
    const double s = 1.0 / a.temperature;
    if (!std::isfinite(a.temperature) || a.temperature <= 0 ||
        !(s >= kMinScale && s <= kMaxScale)) {
      fail(
          "--temperature must be in [4.24e-39, 8.5e37] (scale = 1/T in [1.18e-38, 2.36e38]), got " +
          a.temperature_opt->as<std::string>());
    }
    opts.scale = s;
  } else if (a.no_scale) {
    opts.scale = 1.0;
  }
  const bool mask_file = mask_is_file(a);
  if (a.mask == "causal") opts.causal = Causal::top_left;
  if (a.mask == "causal-bottom-right") opts.causal = Causal::bottom_right;
  if (mask_file && !path_exists(a.mask)) {
    fail("--mask must be 'causal', 'causal-bottom-right' or an existing .npy file; got '" + a.mask +
         "'");
  }
  if (!a.window.empty()) {
    // "LEFT,RIGHT", each an integer >= -1 (-1: unbounded); the library checks the range.
    const auto comma = a.window.find(',');
    std::size_t used_l = 0, used_r = 0;
    bool ok = comma != std::string::npos;
    try {
      if (ok) {
        opts.window_left = std::stoll(a.window.substr(0, comma), &used_l);
        opts.window_right = std::stoll(a.window.substr(comma + 1), &used_r);
        ok = used_l == comma && used_r == a.window.size() - comma - 1;
      }
    } catch (const std::exception&) {
      ok = false;
    }
    if (!ok) fail("--window must be LEFT,RIGHT (integers, -1 = unbounded), got '" + a.window + "'");
  }
  if (a.softcap_opt->count() > 0 && !(std::isfinite(a.softcap) && a.softcap > 0))
    fail("--softcap must be finite and > 0, got " + a.softcap_opt->as<std::string>());
  opts.softcap = a.softcap;
  opts.alibi = a.alibi;
  check_files({{"--out", a.out}, {"--lse", a.lse}, {"--weights", a.weights}},
              {{"--q", a.q},
               {"--k", a.k},
               {"--v", a.v},
               {"--mask", mask_file ? a.mask : std::string()},
               {"--key-lengths", a.key_lengths},
               {"--alibi-slopes", a.alibi_slopes},
               {"--sinks", a.sinks},
               {"--cu-seqlens-q", a.cu_q},
               {"--cu-seqlens-k", a.cu_k}});
  const bool packed = !a.cu_q.empty() || !a.cu_k.empty();
  if (packed && (a.cu_q.empty() || a.cu_k.empty()))
    fail("--cu-seqlens-q and --cu-seqlens-k go together (packed batches)");
  return opts;
}

// Q, K and V as read, and their 16-bit copies when the compute dtype is bf16 or f16.
struct Qkv {
  npy::Array q, k, v;
  DType compute = DType::f32;
  std::vector<std::uint16_t> half_q, half_k, half_v;
};

void load_qkv(const RunArgs& a, bool packed, Qkv& in) {
  npy::Array &q = in.q, &k = in.k, &v = in.v;
  DType& compute = in.compute;
  const char* const qkv_shapes = "rank 2 [L, D], 3 [B, L, D] or 4 [B, H, L, D]";
  q = load_float("Q", a.q, 2, 4, qkv_shapes, a.reference, true);
  k = load_float("K", a.k, 2, 4, qkv_shapes, a.reference, true);
  v = load_float("V", a.v, 2, 4, qkv_shapes, a.reference, true);
  // The compute dtype: --dtype, else float16 when Q, K and V all are, else float32 (float64 with
  // --reference). Reduced-precision inputs are rounded to nearest even once, here.
  if (!a.dtype.empty()) {
    compute = a.dtype == "bf16" ? DType::bf16 : a.dtype == "f16" ? DType::f16 : DType::f32;
  } else if (q.dtype == DType::f16 && k.dtype == DType::f16 && v.dtype == DType::f16) {
    compute = DType::f16;
  }
  const auto narrow = [&](npy::Array& arr, std::vector<std::uint16_t>& half) {
    if (compute == DType::f32) {
      if (arr.dtype == DType::f16) arr = npy::to_f32(arr);
      return;
    }
    if (arr.dtype == DType::f16 && compute == DType::f16) {
      half.resize(arr.data.size() / 2);
      std::memcpy(half.data(), arr.data.data(), arr.data.size());
    } else {
      const npy::Array f = npy::to_f32(arr);
      half.resize(f.data.size() / 4);
      for (std::size_t i = 0; i < half.size(); ++i) {
        float x;
        std::memcpy(&x, f.data.data() + i * 4, 4);
        half[i] = compute == DType::bf16 ? to_bf16(x) : to_f16(x);
      }
    }
    arr = npy::to_f32(arr);  // shapes and strides for the views below; data from `half`
  };
  narrow(q, in.half_q);
  narrow(k, in.half_k);
  narrow(v, in.half_v);
  const int rank = q.rank();
  if (k.rank() != rank || v.rank() != rank) {
    fail("Q, K and V must have the same rank; got Q " + npy::shape_str(q.shape) + ", K " +
         npy::shape_str(k.shape) + ", V " + npy::shape_str(v.shape));
  }
  if (packed && rank != 3) {
    fail("with --cu-seqlens-q/k, Q, K and V are packed [total, heads, d] (rank 3); got Q " +
         npy::shape_str(q.shape));
  }
}

// The optional input files (mask, key lengths, ALiBi slopes, sinks), loaded and put in opts.
struct SdpaExtras {
  npy::Array mask, key_lengths, slopes, sinks;
};

void load_extras(const RunArgs& a, const npy::Array& q,
                 const std::vector<std::int64_t>& scores_shape, SdpaExtras& x,
                 AttentionOptions& opts) {
  const int rank = q.rank();
  if (mask_is_file(a)) {
    x.mask = load_mask(a.mask, scores_shape, "Q's shape with Lk last");
    opts.mask = as_bhlx(npy::input_view(x.mask));
  }
  if (!a.key_lengths.empty()) {
    x.key_lengths = load_key_lengths(a.key_lengths, rank == 2 ? 1 : q.shape[0], rank == 2);
    opts.key_lengths = npy::input_view(x.key_lengths);
  }

  // Per-head vectors [H] (H = 1 for rank-2 and rank-3 inputs), converted to float32.
  if (!a.alibi_slopes.empty()) {
    x.slopes = npy::to_f32(load_float("alibi slopes", a.alibi_slopes, 1, 1, "rank 1 [H]", true),
                           named("alibi slopes", a.alibi_slopes));
    opts.alibi_slopes = npy::input_view(x.slopes);
  }
  if (!a.sinks.empty()) {
    x.sinks = npy::to_f32(load_float("sinks", a.sinks, 1, 1, "rank 1 [H]", true),
                          named("sinks", a.sinks));
    opts.sinks = npy::input_view(x.sinks);
  }
}

// The outputs, in memory, and their views in opts.
struct SdpaOutputs {
  npy::Array out, lse, weights;
};

void make_outputs(const RunArgs& a, const Qkv& in, const std::vector<std::int64_t>& scores_shape,
                  bool packed, SdpaOutputs& o, AttentionOptions& opts) {
  const npy::Array &q = in.q, &v = in.v;
  o.out = npy::zeros(DType::f32, with_last(q.shape, v.shape.back()));
  if (!a.lse.empty() && packed) {
    o.lse = npy::zeros(DType::f32, {q.shape[1], q.shape[0]});  // [H, total_q]
    opts.lse = npy::output_view(o.lse);
  } else if (!a.lse.empty()) {
    o.lse = npy::zeros(DType::f32, std::vector<std::int64_t>(q.shape.begin(), q.shape.end() - 1));
    opts.lse = as_bhl(npy::output_view(o.lse));
  }
  if (!a.weights.empty()) {
    o.weights = npy::zeros(DType::f32, scores_shape);
    opts.weights = as_bhlx(npy::output_view(o.weights));
  }
}

// The call: fast path or reference, dense or packed.
void call_sdpa(const RunArgs& a, Qkv& in, SdpaOutputs& o, const AttentionOptions& opts,
               bool packed) {
  const npy::Array &q = in.q, &k = in.k, &v = in.v;
  TensorView qv = as_bhlx(npy::input_view(q));
  TensorView kv = as_bhlx(npy::input_view(k));
  TensorView vv = as_bhlx(npy::input_view(v));
  if (const DType compute = in.compute; compute != DType::f32) {
    // Same shapes and element strides; the elements are the rounded 16-bit values.
    qv.data = in.half_q.data(), qv.dtype = compute;
    kv.data = in.half_k.data(), kv.dtype = compute;
    vv.data = in.half_v.data(), vv.dtype = compute;
  }
  OutputView ov = as_bhlx(npy::output_view(o.out));
  if (packed) {
    // Packed [total, heads, d] views as they are; the library cuts them per sequence.
    const auto keep_data = [](TensorView& t, const TensorView& packed_view) {
      const void* data = t.data;
      const DType dt = t.dtype;
      t = packed_view;
      t.data = data, t.dtype = dt;
    };
    keep_data(qv, npy::input_view(q));
    keep_data(kv, npy::input_view(k));
    keep_data(vv, npy::input_view(v));
    ov = npy::output_view(o.out);
    const npy::Array cq = npy::read(a.cu_q), ck = npy::read(a.cu_k);
    const TensorView cqv = npy::input_view(cq), ckv = npy::input_view(ck);
    if (a.reference) {
      reference_attention_varlen(qv, kv, vv, ov, cqv, ckv, opts);
    } else {
      const std::unique_ptr<Context> context = make_context(a.threads, a.simd);
      attention_varlen(qv, kv, vv, ov, cqv, ckv, opts, context.get());
    }
  } else if (a.reference) {
    if (a.threads > 0) {
      tbb::task_arena arena(a.threads);
      arena.execute([&] { reference_attention(qv, kv, vv, ov, opts); });
    } else {
      reference_attention(qv, kv, vv, ov, opts);
    }
  } else {
    const std::unique_ptr<Context> context = make_context(a.threads, a.simd);
    attention(qv, kv, vv, ov, opts, context.get());
  }
}

void run_sdpa(const RunArgs& a) {
  AttentionOptions opts = sdpa_options(a);
  const bool packed = !a.cu_q.empty() || !a.cu_k.empty();
  Qkv in;
  load_qkv(a, packed, in);
  SdpaExtras extras;
  // The scores in the inputs' rank: Q's shape with Lk last.
  const std::vector<std::int64_t> scores_shape = with_last(in.q.shape, in.k.shape[in.k.rank() - 2]);
  load_extras(a, in.q, scores_shape, extras, opts);
  SdpaOutputs o;
  make_outputs(a, in, scores_shape, packed, o, opts);
  call_sdpa(a, in, o, opts, packed);
  // Files: all staged, then committed together, so that none is written if one fails.
  files::OutputFiles outputs;
  if (!a.weights.empty()) outputs.stage(a.weights, npy::as_bytes(a.weights, o.weights));
  if (!a.lse.empty()) outputs.stage(a.lse, npy::as_bytes(a.lse, o.lse));
  outputs.stage(a.out, npy::as_bytes(a.out, o.out));
  outputs.commit();
}

// A weight matrix [rows, cols] or vector [n] of an alignment model.
npy::Array load_weight(const char* what, const std::string& path, int rank) {
  return load_float(what, path, rank, rank, rank == 1 ? "rank 1 [A]" : "rank 2 [in, out]");
}

// Additive (Bahdanau) or multiplicative (Luong) attention.
void run_align(const RunArgs& a, unsigned kind) {
  if (is_causal_keyword(a.mask)) {
    fail("--mask " + a.mask + " is only for --kind sdpa; --kind " + kind_name(kind) +
         " takes a .npy mask broadcastable to [B, Lq, Lk]");
  }
  check_files({{"--out", a.out}, {"--weights", a.weights}}, {{"--h", a.h},
                                                             {"--s", a.s},
                                                             {"--values", a.values},
                                                             {"--w1", a.w1},
                                                             {"--w2", a.w2},
                                                             {"--va", a.va},
                                                             {"--b1", a.b1},
                                                             {"--b2", a.b2},
                                                             {"--w", a.w},
                                                             {"--mask", a.mask},
                                                             {"--key-lengths", a.key_lengths}});

  // ---- The model (its constructor checks the weights against each other).
  std::optional<AdditiveAttention> additive;
  std::optional<MultiplicativeAttention> multiplicative;
  if (kind == kAdditive) {
    const npy::Array w1 = load_weight("W1", a.w1, 2), w2 = load_weight("W2", a.w2, 2);
    const npy::Array va = load_weight("v (--va)", a.va, 1);
    npy::Array b1, b2;
    AdditiveWeights aw{npy::input_view(w1), npy::input_view(w2), npy::input_view(va), {}, {}};
    if (!a.b1.empty()) {
      b1 = load_weight("b1", a.b1, 1);
      aw.b1 = npy::input_view(b1);
    }
    if (!a.b2.empty()) {
      b2 = load_weight("b2", a.b2, 1);
      aw.b2 = npy::input_view(b2);
    }
    additive.emplace(aw);  // copies the weights
  } else {
    const npy::Array w = load_weight("W", a.w, 2);
    multiplicative.emplace(npy::input_view(w), !a.unscaled);
  }

  // ---- Inputs.
  const char* const states = "rank 2 [L, F] or 3 [B, L, F]";
  const npy::Array h = load_float("H", a.h, 2, 3, states);
  const npy::Array s = load_float("S", a.s, 2, 3, states);
  const int rank = h.rank();
  const bool unbatched = rank == 2;
  npy::Array values;
  if (!a.values.empty()) values = load_float("values", a.values, 2, 3, states);
  const npy::Array& vals = a.values.empty() ? s : values;
  if (s.rank() != rank || vals.rank() != rank) {
    fail("H, S and the values must have the same rank; got H " + npy::shape_str(h.shape) + ", S " +
         npy::shape_str(s.shape) +
         (a.values.empty() ? "" : ", values " + npy::shape_str(vals.shape)));
  }
  const std::int64_t Lk = s.shape[rank - 2];
  const std::vector<std::int64_t> scores_shape = with_last(h.shape, Lk);

  AlignOptions opts;
  if (!a.values.empty()) opts.values = as_blx(npy::input_view(values));
  npy::Array mask, key_lengths;
  if (!a.mask.empty()) {
    mask = load_mask(a.mask, scores_shape, "H's shape with Lk last");
    opts.mask = npy::input_view(mask);  // rank 2 or 3: the library broadcasts it to [B, Lq, Lk]
  }
  if (!a.key_lengths.empty()) {
    key_lengths = load_key_lengths(a.key_lengths, unbatched ? 1 : h.shape[0], unbatched);
    opts.key_lengths = npy::input_view(key_lengths);
  }

  // ---- Outputs, in memory.
  npy::Array out = npy::zeros(DType::f32, with_last(h.shape, vals.shape.back()));
  npy::Array weights;
  if (!a.weights.empty()) {
    weights = npy::zeros(DType::f32, scores_shape);
    opts.weights = as_blx(npy::output_view(weights));
  }
  const TensorView hv = as_blx(npy::input_view(h)), sv = as_blx(npy::input_view(s));
  const OutputView ov = as_blx(npy::output_view(out));
  const std::unique_ptr<Context> context = make_context(a.threads, a.simd);
  if (additive) {
    additive->forward(hv, sv, ov, opts, context.get());
  } else {
    multiplicative->forward(hv, sv, ov, opts, context.get());
  }

  // ---- Files: committed together.
  files::OutputFiles outputs;
  if (!a.weights.empty()) outputs.stage(a.weights, npy::as_bytes(a.weights, weights));
  outputs.stage(a.out, npy::as_bytes(a.out, out));
  outputs.commit();
}

void run(const RunArgs& a) {
  const unsigned kind = a.kind == "additive"         ? kAdditive
                        : a.kind == "multiplicative" ? kMultiplicative
                                                     : kSdpa;
  check_kind_options(a, kind);
  if (kind == kSdpa) {
    run_sdpa(a);
  } else {
    run_align(a, kind);
  }
}

// Registers an option that only some kinds take.
CLI::Option* only(RunArgs& a, CLI::Option* o, unsigned allowed, unsigned required = 0) {
  a.kind_options.push_back({"--" + o->get_lnames().at(0), o, allowed, required});
  return o;
}

// --kind and the inputs of each kind.
void add_input_options(CLI::App* cmd, RunArgs& a) {
  const unsigned kAlign = kAdditive | kMultiplicative;
  cmd->add_option("--kind", a.kind,
                  "sdpa (default): scaled dot-product attention of Q, K, V; additive: "
                  "a_ij = softmax_j(v^T tanh(W1 h_i + b1 + W2 s_j + b2)); multiplicative: "
                  "a_ij = softmax_j(h_i^T W s_j / sqrt(d_dec)). Both give OUT_i = sum_j a_ij s_j")
      ->check(CLI::IsMember({"sdpa", "additive", "multiplicative"}))
      ->type_name("sdpa|additive|multiplicative");
  only(a, cmd->add_option("--q", a.q, "sdpa: queries [.., Lq, D] (.npy, float32 or float64)"),
       kSdpa, kSdpa)
      ->type_name("Q.npy");
  only(a, cmd->add_option("--k", a.k, "sdpa: keys [.., Lk, D], same rank as Q"), kSdpa, kSdpa)
      ->type_name("K.npy");
  only(a, cmd->add_option("--v", a.v, "sdpa: values [.., Lk, Dv], same rank as Q"), kSdpa, kSdpa)
      ->type_name("V.npy");
  only(a,
       cmd->add_option("--h", a.h,
                       "additive/multiplicative: decoder states [B, Lq, d_dec] or [Lq, d_dec]"),
       kAlign, kAlign)
      ->type_name("H.npy");
  only(a,
       cmd->add_option("--s", a.s,
                       "additive/multiplicative: encoder states [B, Lk, d_enc] or [Lk, d_enc], "
                       "same rank as H"),
       kAlign, kAlign)
      ->type_name("S.npy");
  only(a,
       cmd->add_option("--values", a.values,
                       "additive/multiplicative: what is averaged, [B, Lk, dv] (default: S)"),
       kAlign)
      ->type_name("VALS.npy");
  only(a, cmd->add_option("--w1", a.w1, "additive: W1 [d_dec, A], applied to H"), kAdditive,
       kAdditive)
      ->type_name("W1.npy");
  only(a, cmd->add_option("--w2", a.w2, "additive: W2 [d_enc, A], applied to S"), kAdditive,
       kAdditive)
      ->type_name("W2.npy");
  only(a, cmd->add_option("--va", a.va, "additive: the vector v [A]"), kAdditive, kAdditive)
      ->type_name("V.npy");
  only(a, cmd->add_option("--b1", a.b1, "additive: bias b1 [A]"), kAdditive)->type_name("B1.npy");
  only(a, cmd->add_option("--b2", a.b2, "additive: bias b2 [A]"), kAdditive)->type_name("B2.npy");
  only(a, cmd->add_option("--w", a.w, "multiplicative: W [d_dec, d_enc]"), kMultiplicative,
       kMultiplicative)
      ->type_name("W.npy");
  only(a,
       cmd->add_flag("--unscaled", a.unscaled,
                     "multiplicative: scores h^T W s without the 1/sqrt(d_dec) factor"),
       kMultiplicative);
}

// The output and the masks every kind takes.
void add_output_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--out", a.out,
                  "Output [.., Lq, Dv], float32. Written atomically and only if the run succeeds")
      ->required()
      ->type_name("OUT.npy");
  cmd->add_option("--mask", a.mask,
                  "'causal' (query i sees keys j <= i), 'causal-bottom-right' (query i sees keys "
                  "j <= i + Lk - Lq, for KV-cache decoding), or a .npy mask broadcastable (NumPy "
                  "rules) to the scores [.., Lq, Lk]: bool (true = may attend) or float32/float64 "
                  "(added to the scaled scores, e.g. -inf or -1e9 to block). additive and "
                  "multiplicative take a .npy mask only")
      ->type_name("causal|causal-bottom-right|MASK.npy");
  cmd->add_option("--key-lengths", a.key_lengths,
                  "int32/int64 .npy of shape [B]: in batch b only keys 0..len[b]-1 are attended "
                  "(padded batches). Rank-2 inputs are one batch")
      ->type_name("LEN.npy");
}

// sdpa's scale, its extra outputs, threads, provider and compute dtype.
void add_scale_options(CLI::App* cmd, RunArgs& a) {
  auto* scale = only(a,
                     cmd->add_option("--scale", a.scale,
                                     "sdpa: multiply Q K^T by S (finite, > 0). Default 1/sqrt(D)"),
                     kSdpa)
                    ->type_name("S");
  auto* temperature = only(a,
                           cmd->add_option("--temperature", a.temperature,
                                           "sdpa: softmax temperature T (finite, > 0): scale = "
                                           "1/T. Small T approaches argmax"),
                           kSdpa)
                          ->type_name("T");
  auto* no_scale = only(
      a, cmd->add_flag("--no-scale", a.no_scale, "sdpa: scale 1, plain softmax(Q K^T)"), kSdpa);
  scale->excludes(temperature);
  scale->excludes(no_scale);
  temperature->excludes(no_scale);
  a.scale_opt = scale;
  a.temperature_opt = temperature;
  only(a,
       cmd->add_option("--lse", a.lse,
                       "sdpa: also write the log-sum-exp of each row's scaled, masked scores "
                       "[.., Lq] (float32; -inf for a fully masked row)"),
       kSdpa)
      ->type_name("LSE.npy");
  cmd->add_option("--weights", a.weights,
                  "Also write the attention weights (each row sums to 1) [.., Lq, Lk] (float32)")
      ->type_name("W.npy");
  add_threads_option(*cmd, a.threads);
  add_simd_option(*cmd, a.simd);
  only(a,
       cmd->add_option("--dtype", a.dtype,
                       "sdpa: round Q, K and V to this dtype (nearest even) and compute with it: "
                       "f32, bf16 or f16 (default: f16 when all three files are '<f2', else f32); "
                       "outputs stay float32")
           ->check(CLI::IsMember({"f32", "bf16", "f16"})),
       kSdpa);
}

// sdpa's score variants, packed batches and the reference.
void add_variant_options(CLI::App* cmd, RunArgs& a) {
  only(a,
       cmd->add_option("--window", a.window,
                       "sdpa: sliding window: query i (at position p = i + Lk - Lq among the keys) "
                       "attends key j only if p - LEFT <= j <= p + RIGHT; -1 = unbounded on that "
                       "side. Combines with --mask and --key-lengths"),
       kSdpa)
      ->type_name("LEFT,RIGHT");
  a.softcap_opt =
      only(a,
           cmd->add_option("--softcap", a.softcap,
                           "sdpa: soft-cap the scaled scores, s <- C tanh(s / C), before ALiBi and "
                           "masks (C finite, > 0)"),
           kSdpa)
          ->type_name("C");
  auto* alibi = only(a,
                     cmd->add_flag("--alibi", a.alibi,
                                   "sdpa: ALiBi with the standard slopes of H heads: "
                                   "s <- s - slope_h |p - j|, after soft-capping"),
                     kSdpa);
  auto* alibi_slopes = only(a,
                            cmd->add_option("--alibi-slopes", a.alibi_slopes,
                                            "sdpa: ALiBi with these slopes, float32/float64 [H]"),
                            kSdpa)
                           ->type_name("S.npy");
  alibi->excludes(alibi_slopes);
  only(a,
       cmd->add_option("--sinks", a.sinks,
                       "sdpa: one sink logit per head, float32/float64 [H] (finite or -inf), "
                       "added to each row's softmax denominator only (weights then sum below 1)"),
       kSdpa)
      ->type_name("SINKS.npy");
  only(a,
       cmd->add_option("--cu-seqlens-q", a.cu_q,
                       "sdpa: packed variable-length batch: int32/int64 [B + 1] offsets of each "
                       "sequence's queries in Q [total_q, H, D] (with --cu-seqlens-k; Q, K, V "
                       "rank 3; each sequence attends to its own keys; LSE is [H, total_q])"),
       kSdpa)
      ->type_name("CQ.npy");
  only(a,
       cmd->add_option("--cu-seqlens-k", a.cu_k,
                       "sdpa: the offsets of each sequence's keys in K and V [total_k, Hkv, D]"),
       kSdpa)
      ->type_name("CK.npy");
  only(a,
       cmd->add_flag("--reference", a.reference,
                     "sdpa: use the slow double-precision reference implementation instead of "
                     "the fast path (float64 inputs are used as is)"),
       kSdpa);
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run attention on .npy files: OUT = softmax(scale * Q K^T + mask) V (--kind sdpa), or "
      "additive (Bahdanau) / multiplicative (Luong) attention of decoder states over encoder "
      "states");
  add_input_options(cmd, *args);
  add_output_options(cmd, *args);
  add_scale_options(cmd, *args);
  add_variant_options(cmd, *args);
  cmd->footer(
      "sdpa: Q, K and V have the same rank: 2 [L, D], 3 [B, L, D] or 4 [B, H, L, D]. With rank 4, "
      "K and V may have fewer heads than Q (grouped-query attention). V's last dimension Dv may "
      "differ from D. Inputs are float32, float64 or float16 ('<f2'); the fast path computes in "
      "float32 (or from bf16/f16 inputs with --dtype), --reference in float64. Outputs are float32 "
      "and keep Q's rank.\n"
      "additive, multiplicative: H and S have rank 3 [B, L, F] or 2 [L, F] (one batch; outputs "
      "then have no batch axis either). float64 inputs are converted to float32.\n"
      "Options of one kind given with another are an error.\n"
      "Exit status: 0 on success, 2 on bad input (message on stderr; OUT is not written).\n"
      "Examples:\n"
      "  cpuattn run --q q.npy --k k.npy --v v.npy --out out.npy --mask causal\n"
      "  cpuattn run --q q.npy --k k.npy --v v.npy --out out.npy --mask mask.npy \\\n"
      "      --no-scale --weights w.npy --lse lse.npy --threads 4\n"
      "  cpuattn run --kind additive --h h.npy --s s.npy --w1 w1.npy --w2 w2.npy --va v.npy \\\n"
      "      --out ctx.npy --weights a.npy\n"
      "  cpuattn run --kind multiplicative --h h.npy --s s.npy --w w.npy --out ctx.npy\n"
      "In NumPy: np.save('q.npy', q.astype(np.float32)); out = np.load('out.npy')");
  cmd->callback([args, &exit_code] { guarded(exit_code, [&] { run(*args); }); });
}

}  // namespace cpuattn::cli
