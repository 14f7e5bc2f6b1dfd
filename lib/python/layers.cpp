// The layers of cpuattn/layers.h: MultiHeadAttention (self, cross and decoding with a KvCache).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "common.h"  // and cpuattn/layers.h
#include "cpuattn/cpuattn.h"

namespace cpuattn_py {
namespace {

using namespace pybind11::literals;

std::optional<cpuattn::TensorView> optional_input(Call& call, const py::object& obj,
                                                  const char* name) {
  if (obj.is_none()) return std::nullopt;
  return input_view(call, obj, name);
}

// [B, L, d_model] output of a layer: the caller's array, or a new one of x's dtype.
std::pair<py::array, cpuattn::OutputView> layer_out(Call& call, const py::object& out_obj,
                                                    std::vector<py::ssize_t> shape, DType x) {
  if (out_obj.is_none()) {
    py::array out = new_array(x, shape);
    call.keep.push_back(out);
    return {out, make_view<cpuattn::OutputView>(out, x, "out")};
  }
  py::array out = writable(out_obj, "out");
  call.keep.push_back(out);
  return {out, make_view<cpuattn::OutputView>(out, dtype_of(out, "out", false), "out")};
}

// Explicit rotary positions (any integer array, as int64), or none.
std::optional<cpuattn::TensorView> positions_view(Call& call, const py::object& positions) {
  if (positions.is_none()) return std::nullopt;
  const py::array p = int64_array(positions, "positions");
  call.keep.push_back(p);
  return make_view<cpuattn::TensorView>(p, DType::i64, "positions");
}

std::vector<py::ssize_t> leading_shape(const py::array& x, py::ssize_t last) {
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  if (!shape.empty()) shape.back() = last;
  return shape;
}

// A number of a `rope` dict: `key`'s value as a double (or int64 for positions).
template <class T>
T rope_number(const py::dict& d, const char* key, const char* where, T def) {
  if (!d.contains(key) || d[key].is_none()) return def;
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    fail(std::string(where) + "['" + key + "'] must be a number, got " +
         std::string(py::str(d[key].get_type())));
  }
}

void reject_unknown(const py::dict& d, const char* where, std::initializer_list<const char*> keys) {
  for (const auto& item : d) {
    const std::string k = py::str(item.first);
    bool known = false;
    for (const char* name : keys) known = known || k == name;
    if (!known) {
      std::string list;
      for (const char* name : keys) list += std::string(list.empty() ? "" : ", ") + name;
      fail(std::string(where) + " has an unknown key '" + k + "'; expected " + list);
    }
  }
}

// rope = {"theta": 10000, "style": "half" | "interleaved", "rotary_dim": 0, "scaling": a Hugging
// Face rope_scaling dict ({"rope_type": "linear" | "dynamic"... })}.
cpuattn::RopeOptions parse_rope(const py::object& obj) {
  if (!py::isinstance<py::dict>(obj))
    fail("rope must be a dict (theta, style, rotary_dim, scaling), got " +
         std::string(py::str(obj.get_type())));
  const auto d = obj.cast<py::dict>();
  reject_unknown(d, "rope", {"theta", "style", "rotary_dim", "scaling"});
  cpuattn::RopeOptions r;
  r.base = rope_number(d, "theta", "rope", r.base);
  r.rotary_dim = rope_number<std::int64_t>(d, "rotary_dim", "rope", 0);
  if (d.contains("style") && !d["style"].is_none()) {
    const std::string st = py::str(d["style"]);
    if (st != "half" && st != "interleaved")
      fail("rope['style'] must be 'half' or 'interleaved', got '" + st + "'");
    r.style = st == "half" ? cpuattn::RopeStyle::half : cpuattn::RopeStyle::interleaved;
  }
  if (!d.contains("scaling") || d["scaling"].is_none()) return r;
  if (!py::isinstance<py::dict>(d["scaling"]))
    fail("rope['scaling'] must be a dict (a Hugging Face rope_scaling), got " +
         std::string(py::str(d["scaling"].get_type())));
  const auto sd = d["scaling"].cast<py::dict>();
  const char* where = "rope['scaling']";
  reject_unknown(
      sd, where,
      {"rope_type", "type", "factor", "original_max_position_embeddings", "low_freq_factor",
       "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"});
  const char* type_key = sd.contains("rope_type") ? "rope_type" : "type";
  const std::string type = sd.contains(type_key) ? std::string(py::str(sd[type_key])) : "default";
  cpuattn::RopeScaling& sc = r.scaling;
  using T = cpuattn::RopeScalingType;
  if (type == "default")
    sc.type = T::none;
  else if (type == "linear")
    sc.type = T::linear;
  else if (type == "ntk")
    sc.type = T::ntk;
  else if (type == "llama3")
    sc.type = T::llama3;
  else if (type == "yarn")
    sc.type = T::yarn;
  else
    fail(std::string(where) + "['" + type_key + "'] is '" + type +
         "'; expected 'default', 'linear', 'ntk', 'llama3' or 'yarn'");
  sc.factor = rope_number(sd, "factor", where, sc.factor);
  sc.original_max_position = rope_number<std::int64_t>(sd, "original_max_position_embeddings",
                                                       where, sc.original_max_position);
  sc.low_freq_factor = rope_number(sd, "low_freq_factor", where, sc.low_freq_factor);
  sc.high_freq_factor = rope_number(sd, "high_freq_factor", where, sc.high_freq_factor);
  sc.beta_fast = rope_number(sd, "beta_fast", where, sc.beta_fast);
  sc.beta_slow = rope_number(sd, "beta_slow", where, sc.beta_slow);
  sc.attention_factor = rope_number(sd, "attention_factor", where, sc.attention_factor);
  return r;
}

cpuattn::QkNorm parse_qk_norm(const py::object& obj) {
  if (obj.is_none()) return cpuattn::QkNorm::none;
  const std::string v = py::str(obj);
  if (v == "head") return cpuattn::QkNorm::head;
  if (v == "projection") return cpuattn::QkNorm::projection;
  fail("qk_norm must be None, 'head' or 'projection', got '" + v + "'");
}

using Mha = cpuattn::MultiHeadAttention;
using MhaClass = py::class_<Mha>;

// The constructor (weights, optional biases, RoPE and QK-norm) and the shape properties.
void def_mha_construction(MhaClass& cls) {
  cls.def(py::init([](std::int64_t d_model, std::int64_t heads, const py::handle& wq,
                      const py::handle& wk, const py::handle& wv, const py::handle& wo,
                      std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
                      const py::object& bq, const py::object& bk, const py::object& bv,
                      const py::object& bo, bool bf16, const py::object& rope,
                      const py::object& qk_norm, const py::object& q_norm, const py::object& k_norm,
                      double qk_norm_eps) {
            Call call;
            cpuattn::MhaWeights w;
            w.wq = input_view(call, wq, "wq", bf16);
            w.wk = input_view(call, wk, "wk", bf16);
            w.wv = input_view(call, wv, "wv", bf16);
            w.wo = input_view(call, wo, "wo", bf16);
            w.bq = optional_input(call, bq, "bq");
            w.bk = optional_input(call, bk, "bk");
            w.bv = optional_input(call, bv, "bv");
            w.bo = optional_input(call, bo, "bo");
            w.q_norm = optional_input(call, q_norm, "q_norm");
            w.k_norm = optional_input(call, k_norm, "k_norm");
            cpuattn::MhaConfig c{.d_model = d_model,
                                 .heads = heads,
                                 .kv_heads = kv_heads,
                                 .head_dim = head_dim,
                                 .value_dim = value_dim};
            if (!rope.is_none()) c.rope = parse_rope(rope);
            c.qk_norm = parse_qk_norm(qk_norm);
            c.qk_norm_eps = qk_norm_eps;
            return std::make_unique<Mha>(c, w);
          }),
          "d_model"_a, "heads"_a, "wq"_a, "wk"_a, "wv"_a, "wo"_a, py::kw_only(), "kv_heads"_a = 0,
          "head_dim"_a = 0, "value_dim"_a = 0, "bq"_a = py::none(), "bk"_a = py::none(),
          "bv"_a = py::none(), "bo"_a = py::none(), "bf16"_a = false, "rope"_a = py::none(),
          "qk_norm"_a = py::none(), "q_norm"_a = py::none(), "k_norm"_a = py::none(),
          "qk_norm_eps"_a = 1e-6)
      .def_property_readonly("d_model", [](const Mha& l) { return l.config().d_model; })
      .def_property_readonly("heads", [](const Mha& l) { return l.config().heads; })
      .def_property_readonly("kv_heads", [](const Mha& l) { return l.config().kv_heads; })
      .def_property_readonly("head_dim", [](const Mha& l) { return l.config().head_dim; })
      .def_property_readonly("value_dim", [](const Mha& l) { return l.config().value_dim; });
}

// forward() and forward_varlen(): self-attention, dense or packed.
void def_mha_self_attention(MhaClass& cls) {
  cls.def(
         "forward",
         [](const Mha& l, const py::handle& x, const py::handle& is_causal,
            const py::object& attn_mask, const py::object& key_lengths, std::optional<double> scale,
            const py::object& positions, const py::object& out, std::optional<int> threads,
            CtxHandle* context) {
           Call call;
           const auto xv = input_view(call, x, "x");
           call.set_masks(attn_mask, key_lengths, scale);
           call.opts.causal = parse_causal(is_causal);
           auto [o, ov] =
               layer_out(call, out, leading_shape(call.keep[0], l.config().d_model), xv.dtype);
           const std::optional<cpuattn::TensorView> pv = positions_view(call, positions);
           const ContextUse ctx = pick_context(threads, context);
           {
             py::gil_scoped_release nogil;
             if (pv) {
               l.forward(xv, *pv, ov, call.opts, ctx);
             } else {
               l.forward(xv, ov, call.opts, ctx);
             }
           }
           return returned(out, o, ov.dtype, x);
         },
         "Self-attention: x [B, L, d_model] -> [B, L, d_model]. x and out are float32, float16 or "
         "bfloat16 (a torch tensor; NumPy has no bfloat16); the result is new, of x's dtype and "
         "type (a torch tensor for a torch x), or out= written in place. positions: integer "
         "[B, L] or [L] for the rotary embedding (Hugging Face's position_ids; default 0 .. L-1; "
         "only for a layer with rope).",
         "x"_a, py::kw_only(), "is_causal"_a = false, "attn_mask"_a = py::none(),
         "key_lengths"_a = py::none(), "scale"_a = py::none(), "positions"_a = py::none(),
         "out"_a = py::none(), "threads"_a = py::none(),
         "context"_a = static_cast<CtxHandle*>(nullptr))
      .def(
          "forward_varlen",
          [](const Mha& l, const py::handle& x, const py::handle& cu_seqlens,
             const py::handle& is_causal, std::optional<double> scale, const py::object& positions,
             const py::object& out, std::optional<int> threads, CtxHandle* context) {
            Call call;
            const auto xv = input_view(call, x, "x");
            const py::array cu = int64_array(cu_seqlens, "cu_seqlens");
            call.keep.push_back(cu);
            const auto cv = make_view<cpuattn::TensorView>(cu, DType::i64, "cu_seqlens");
            call.opts.scale = scale;
            call.opts.causal = parse_causal(is_causal);
            auto [o, ov] =
                layer_out(call, out, leading_shape(call.keep[0], l.config().d_model), xv.dtype);
            const std::optional<cpuattn::TensorView> pv = positions_view(call, positions);
            const ContextUse ctx = pick_context(threads, context);
            {
              py::gil_scoped_release nogil;
              if (pv) {
                l.forward_varlen(xv, cv, *pv, ov, call.opts, ctx);
              } else {
                l.forward_varlen(xv, cv, ov, call.opts, ctx);
              }
            }
            return returned(out, o, ov.dtype, x);
          },
          "Packed variable-length self-attention: x [T, d_model] holds sequences back to back, "
          "cu_seqlens integer [B + 1] their offsets (0 .. T); each sequence attends only to its "
          "own "
          "tokens. Returns [T, d_model] (dtypes and types as forward()). positions: integer [T] "
          "for the rotary embedding "
          "(default: each sequence's own 0 .. length - 1).",
          "x"_a, "cu_seqlens"_a, py::kw_only(), "is_causal"_a = false, "scale"_a = py::none(),
          "positions"_a = py::none(), "out"_a = py::none(), "threads"_a = py::none(),
          "context"_a = static_cast<CtxHandle*>(nullptr));
}

// forward_cross(), decode() and make_cache().
void def_mha_cross_and_decode(MhaClass& cls) {
  cls.def(
         "forward_cross",
         [](const Mha& l, const py::handle& xq, const py::handle& xkv, const py::object& attn_mask,
            const py::object& key_lengths, std::optional<double> scale, const py::object& out,
            std::optional<int> threads, CtxHandle* context) {
           Call call;
           const auto qv = input_view(call, xq, "xq");
           const auto kv = input_view(call, xkv, "xkv");
           call.set_masks(attn_mask, key_lengths, scale);
           auto [o, ov] =
               layer_out(call, out, leading_shape(call.keep[0], l.config().d_model), qv.dtype);
           const ContextUse ctx = pick_context(threads, context);
           {
             py::gil_scoped_release nogil;
             l.forward_cross(qv, kv, ov, call.opts, ctx);
           }
           return returned(out, o, ov.dtype, xq);
         },
         "Encoder-decoder attention: xq [B, Lq, d_model], xkv [B, Lk, d_model].", "xq"_a, "xkv"_a,
         py::kw_only(), "attn_mask"_a = py::none(), "key_lengths"_a = py::none(),
         "scale"_a = py::none(), "out"_a = py::none(), "threads"_a = py::none(),
         "context"_a = static_cast<CtxHandle*>(nullptr))
      .def(
          "decode",
          [](const Mha& l, const py::handle& x, PyKvCache& cache, const py::object& attn_mask,
             const py::object& key_lengths, std::optional<double> scale, const py::object& out,
             std::optional<int> threads, CtxHandle* context) {
            Call call;
            const auto xv = input_view(call, x, "x");
            call.set_masks(attn_mask, key_lengths, scale);
            auto [o, ov] =
                layer_out(call, out, leading_shape(call.keep[0], l.config().d_model), xv.dtype);
            const ContextUse ctx = pick_context(threads, context);
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(cache.mu);
              l.decode(xv, cache.cache, ov, call.opts, ctx);
            }
            return returned(out, o, ov.dtype, x);
          },
          "One decoding step: appends the K/V of x [B, n, d_model] to cache, attends the n new "
          "queries to every cached token (bottom-right causal); returns [B, n, d_model].",
          "x"_a, "cache"_a, py::kw_only(), "attn_mask"_a = py::none(), "key_lengths"_a = py::none(),
          "scale"_a = py::none(), "out"_a = py::none(), "threads"_a = py::none(),
          "context"_a = static_cast<CtxHandle*>(nullptr))
      .def(
          "make_cache",
          [](const Mha& l, std::int64_t batch, std::int64_t capacity, bool growable,
             const std::string& dtype) {
            return std::make_unique<PyKvCache>(
                l.make_cache(batch, capacity, growable, parse_dtype(dtype)));
          },
          "A KvCache shaped for this layer.", "batch"_a, "capacity"_a, "growable"_a = false,
          "dtype"_a = "f32");
}

}  // namespace

void bind_layers(py::module_& m) {
  MhaClass cls(m, "MultiHeadAttention",
               "Multi-head attention, weights in the x W convention (W [in, out]); the "
               "weights are copied (packed) at construction. Decoder layers: rope=dict(theta=, "
               "style='half'|'interleaved', rotary_dim=, scaling=a Hugging Face rope_scaling "
               "dict with rope_type 'linear', 'ntk' (static), 'llama3' or 'yarn') rotates Q "
               "and K inside the layer (positions 0..L-1 in forward, the cache length in "
               "decode; keys are cached rotated); qk_norm='head' (q_norm, k_norm [head_dim]) "
               "or 'projection' ([heads*head_dim], [kv_heads*head_dim]) applies RMSNorm with "
               "qk_norm_eps before the rotation.");
  def_mha_construction(cls);
  def_mha_self_attention(cls);
  def_mha_cross_and_decode(cls);
}

}  // namespace cpuattn_py
