// The module's paged KV caches (vLLM's layout): PagedKvCache, a pool of pages shared by
// sequences, and attention_paged / reference_attention_paged over a pool and a block table.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "common.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"

namespace cpuattn_py {
namespace {

using namespace pybind11::literals;

// A PagedKvCache with a lock: every method that changes it runs with the GIL released and the
// lock held, so Python threads sharing one cache are serialized instead of racing. The pools
// never move: k_pages / v_pages are views of them for the cache's life.
struct PyPagedKvCache {
  cpuattn::PagedKvCache cache;
  std::mutex mu;
  explicit PyPagedKvCache(cpuattn::PagedKvCache c) : cache(std::move(c)) {}
};

// A NumPy view of the library's contiguous tensor `t`, read-only, keeping `owner` alive.
// Dtypes NumPy lacks are their bit patterns (numpy_dtype).
py::array pool_view(const cpuattn::TensorView& t, const py::handle& owner) {
  const py::dtype dt = numpy_dtype(t.dtype);
  std::vector<py::ssize_t> shape, strides;
  for (int d = 0; d < t.rank; ++d) {
    shape.push_back(t.shape[d]);
    strides.push_back(t.strides[d] * static_cast<py::ssize_t>(cpuattn::dtype_size(t.dtype)));
  }
  py::array a(dt, shape, strides, t.data, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// attention_paged() and reference_attention_paged(): the pool and table arrays as a PagedKv.
py::object run_paged(bool reference, const py::handle& q_obj, const py::handle& k_pages,
                     const py::handle& v_pages, const py::handle& block_table,
                     const py::handle& seq_lens, const py::object& k_scales,
                     const py::object& v_scales, const py::handle& is_causal,
                     const std::optional<double>& scale, bool return_lse, const py::object& out_obj,
                     bool bf16, const std::optional<std::string>& kv_dtype,
                     const VariantArgs& variants, cpuattn::Context* ctx) {
  Call call;
  py::array q = as_array(q_obj, "q");
  call.keep.push_back(q);
  if (q.ndim() != 4) fail("q has shape " + shape_str(q) + "; expected [B, H, Lq, D]");
  // The pools' dtype: kv_dtype (bit patterns of its size, as PagedKvCache gives them), else the
  // arrays' own, uint16 read as bfloat16 whatever bf16 says (bf16 is for q and out).
  const auto view = [&](const py::handle& obj, const char* name, bool pool) {
    py::array a = as_array(obj, name);
    call.keep.push_back(a);
    if (!pool || !kv_dtype) return make_view<cpuattn::TensorView>(a, dtype_of(a, name, true), name);
    const DType d = parse_dtype(*kv_dtype);
    if (static_cast<std::size_t>(a.dtype().itemsize()) != cpuattn::dtype_size(d))
      fail(std::string(name) + " has dtype " + numpy_dtype_name(a) + " but kv_dtype is \"" +
           *kv_dtype + "\" (" + std::to_string(cpuattn::dtype_size(d)) + "-byte elements)");
    return make_view<cpuattn::TensorView>(a, d, name);
  };
  cpuattn::PagedKv kv;
  kv.k_pages = view(k_pages, "k_pages", true);
  kv.v_pages = view(v_pages, "v_pages", true);
  py::array table = as_array(block_table, "block_table");
  if (table.dtype().itemsize() != 4 || table.dtype().kind() != 'i') {
    // Ids past int32 cannot name a page: reject them instead of letting the cast wrap.
    const py::array wide = int64_array(table, "block_table");
    const auto* p = static_cast<const std::int64_t*>(wide.data());
    for (py::ssize_t i = 0; i < wide.size(); ++i)
      if (p[i] < INT32_MIN || p[i] > INT32_MAX)
        fail("block_table holds " + std::to_string(p[i]) + ", outside int32");
    table = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>(table);
  }
  call.keep.push_back(table);
  kv.block_table = make_view<cpuattn::TensorView>(table, DType::i32, "block_table");
  const py::array lens = int64_array(seq_lens, "seq_lens");
  call.keep.push_back(lens);
  kv.seq_lens = make_view<cpuattn::TensorView>(lens, DType::i64, "seq_lens");
  if (!k_scales.is_none()) kv.k_scales = view(k_scales, "k_scales", false);
  if (!v_scales.is_none()) kv.v_scales = view(v_scales, "v_scales", false);
  const auto qv = make_view<cpuattn::TensorView>(q, dtype_of(q, "q", bf16), "q");
  call.opts.scale = scale;
  call.opts.causal = parse_causal(is_causal);
  variants.apply(call);
  py::array out = out_obj.is_none()
                      ? new_array(reference ? DType::f64 : qv.dtype,
                                  {q.shape(0), q.shape(1), q.shape(2), kv.v_pages.shape[3]})
                      : writable(out_obj, "out");
  call.keep.push_back(out);
  const DType ot =
      out_obj.is_none() ? (reference ? DType::f64 : qv.dtype) : dtype_of(out, "out", bf16);
  const auto ov = make_view<cpuattn::OutputView>(out, ot, "out");
  py::array lse;
  if (return_lse) {
    lse = new_array(DType::f32, {q.shape(0), q.shape(1), q.shape(2)});
    call.keep.push_back(lse);
    call.opts.lse = make_view<cpuattn::OutputView>(lse, DType::f32, "lse");
  }
  {
    py::gil_scoped_release nogil;
    if (reference)
      cpuattn::reference_attention(qv, kv, ov, call.opts);
    else
      cpuattn::attention(qv, kv, ov, call.opts, ctx);
  }
  return returned(out_obj, out, ot, return_lse ? &lse : nullptr, q_obj);
}

const char* const kPagedDoc = R"doc(
Attention of q [B, H, Lq, D] to B sequences stored in a paged KV cache, read in place:
k_pages [num_pages, Hkv, P, D], v_pages [num_pages, Hkv, P, Dv] (float32, float16, bfloat16 bit
patterns in uint16, or a scaled dtype such as int8 with k_scales / v_scales float32
[num_pages, Hkv, P] per token, [Hkv] per head or [1]; kv_dtype names the pools' dtype when the
arrays hold bit patterns of it, e.g. uint8 pools of an 8-bit float); q and out are float32 or
float16, or bfloat16 bit patterns with bf16=True;
block_table integers [B, max_pages] (token j of sequence b is row j % P of page
block_table[b, j // P]; entries past a sequence's pages are not read); seq_lens integers [B].
PagedKvCache.batch(seqs) gives all of these as keywords: attention_paged(q, **cache.batch(seqs)).

Every option is aligned to each sequence's own length: is_causal="bottom_right" (query i at
position seq_lens[b] - Lq + i) for decoding and chunked prefill; window_size, softcap, alibi,
alibi_slopes ([H] or [B, H]), sinks, scale, return_lse (lse [B, H, Lq]), out, threads and context
as in attention(). A sequence of length 0 gives out 0. Returns out, or (out, lse), of q's type as
attention() (a torch tensor for a torch q); raises
cpuattn.Error naming the argument (a block id outside the pool, a length past the table), and
then writes nothing.
)doc";

void bind_cache(py::module_& m) {
  using C = PyPagedKvCache;
  py::class_<C>(m, "PagedKvCache",
                "A paged KV cache (vLLM's PagedAttention design): a pool of num_pages pages of "
                "page_size tokens of every K/V head, shared by sequences (fork shares a prefix, "
                "copy-on-write), stored as any K/V dtype (f32, bf16, f16, int8, ...; a scaled "
                "one with per-token scales, or static ones: k_scale, v_scale). Methods that "
                "change it may be "
                "called from several threads (they take a lock); an attention call reading its "
                "pool must not overlap one that changes it.")
      .def(py::init([](std::int64_t num_pages, std::int64_t page_size, std::int64_t kv_heads,
                       std::int64_t head_dim, std::optional<std::int64_t> value_dim,
                       const std::string& dtype, const py::object& k_scale,
                       const py::object& v_scale) {
             return std::make_unique<C>(cpuattn::PagedKvCache(
                 num_pages, page_size, kv_heads, head_dim, value_dim.value_or(head_dim),
                 parse_dtype(dtype), {scale_list(k_scale), scale_list(v_scale)}));
           }),
           "num_pages"_a, "page_size"_a, "kv_heads"_a, "head_dim"_a, "value_dim"_a = py::none(),
           py::kw_only(), "dtype"_a = "f32", "k_scale"_a = py::none(), "v_scale"_a = py::none())
      .def_property_readonly("num_pages", [](C& c) { return c.cache.num_pages(); })
      .def_property_readonly("page_size", [](C& c) { return c.cache.page_size(); })
      .def_property_readonly("kv_heads", [](C& c) { return c.cache.kv_heads(); })
      .def_property_readonly("head_dim", [](C& c) { return c.cache.head_dim(); })
      .def_property_readonly("value_dim", [](C& c) { return c.cache.value_dim(); })
      .def_property_readonly("dtype",
                             [](C& c) { return std::string(cpuattn::dtype_name(c.cache.dtype())); })
      .def_property_readonly("free_pages",
                             [](C& c) {
                               std::lock_guard<std::mutex> lock(c.mu);
                               return c.cache.free_pages();
                             })
      .def(
          "add_sequence",
          [](C& c) {
            std::lock_guard<std::mutex> lock(c.mu);
            return c.cache.add_sequence();
          },
          "A new empty sequence; returns its id.")
      .def(
          "fork",
          [](C& c, std::int64_t seq, std::optional<std::int64_t> length) {
            std::lock_guard<std::mutex> lock(c.mu);
            return c.cache.fork(seq, length);
          },
          "A new sequence sharing the first `length` tokens (default all) of seq's pages.", "seq"_a,
          "length"_a = py::none())
      .def(
          "append",
          [](C& c, std::int64_t seq, const py::handle& k, const py::handle& v, bool bf16) {
            Call call;
            py::array ka = as_array(k, "k"), va = as_array(v, "v");
            call.keep = {ka, va};
            const auto kv = make_view<cpuattn::TensorView>(ka, dtype_of(ka, "k", bf16), "k");
            const auto vv = make_view<cpuattn::TensorView>(va, dtype_of(va, "v", bf16), "v");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(c.mu);
            c.cache.append(seq, kv, vv);
          },
          "Appends n tokens to seq: k [kv_heads, n, head_dim], v [kv_heads, n, value_dim] "
          "(float32, float16, or bfloat16 bit patterns with bf16=True), taking pages as needed. "
          "On error (too few free pages, a non-finite value for an int8 cache) nothing changes.",
          "seq"_a, "k"_a, "v"_a, py::kw_only(), "bf16"_a = false)
      .def(
          "truncate",
          [](C& c, std::int64_t seq, std::int64_t length) {
            std::lock_guard<std::mutex> lock(c.mu);
            c.cache.truncate(seq, length);
          },
          "Keeps the first `length` tokens of seq; pages past them return to the pool.", "seq"_a,
          "length"_a)
      .def(
          "free",
          [](C& c, std::int64_t seq) {
            std::lock_guard<std::mutex> lock(c.mu);
            c.cache.free(seq);
          },
          "Releases seq's pages and its id.", "seq"_a)
      .def(
          "length",
          [](C& c, std::int64_t seq) {
            std::lock_guard<std::mutex> lock(c.mu);
            return c.cache.length(seq);
          },
          "seq"_a)
      .def(
          "pages",
          [](C& c, std::int64_t seq) {
            std::lock_guard<std::mutex> lock(c.mu);
            return c.cache.pages(seq);
          },
          "seq's page ids in token order.", "seq"_a)
      .def_property_readonly(
          "k_pages",
          [](py::object self) { return pool_view(self.cast<C&>().cache.key_pages(), self); },
          "The key pool [num_pages, kv_heads, page_size, head_dim]: a read-only view, no copy.")
      .def_property_readonly(
          "v_pages",
          [](py::object self) { return pool_view(self.cast<C&>().cache.value_pages(), self); },
          "The value pool [num_pages, kv_heads, page_size, value_dim]: a read-only view.")
      .def_property_readonly(
          "k_scales",
          [](py::object self) -> py::object {
            const auto s = self.cast<C&>().cache.key_page_scales();
            return s ? py::object(pool_view(*s, self)) : py::none();
          },
          "int8 caches: the key scales [num_pages, kv_heads, page_size] (a view); else None.")
      .def_property_readonly(
          "v_scales",
          [](py::object self) -> py::object {
            const auto s = self.cast<C&>().cache.value_page_scales();
            return s ? py::object(pool_view(*s, self)) : py::none();
          },
          "int8 caches: the value scales (a view); else None.")
      .def(
          "batch",
          [](py::object self, const std::vector<std::int64_t>& seqs) {
            C& c = self.cast<C&>();
            py::dict d;
            std::lock_guard<std::mutex> lock(c.mu);
            const cpuattn::PagedKv kv = c.cache.batch(seqs);
            d["k_pages"] = pool_view(kv.k_pages, self);
            d["v_pages"] = pool_view(kv.v_pages, self);
            // The table and lengths live in the cache until its next batch(): copy them.
            d["block_table"] = pool_view(kv.block_table, self).attr("copy")();
            d["seq_lens"] = pool_view(kv.seq_lens, self).attr("copy")();
            if (kv.k_scales) d["k_scales"] = pool_view(*kv.k_scales, self);
            if (kv.v_scales) d["v_scales"] = pool_view(*kv.v_scales, self);
            d["kv_dtype"] = cpuattn::dtype_short_name(c.cache.dtype());
            return d;
          },
          "The arguments of attention_paged for sequences `seqs` (in that order), as a dict: "
          "k_pages, v_pages (views of the pools), block_table int32 [B, max_pages] and seq_lens "
          "int64 [B] (copies), kv_dtype, and for scaled dtypes (int8) k_scales and v_scales.",
          "seqs"_a)
      .def("__repr__", [](C& c) {
        return "cpuattn.PagedKvCache(num_pages=" + std::to_string(c.cache.num_pages()) +
               ", page_size=" + std::to_string(c.cache.page_size()) +
               ", kv_heads=" + std::to_string(c.cache.kv_heads()) +
               ", head_dim=" + std::to_string(c.cache.head_dim()) +
               ", value_dim=" + std::to_string(c.cache.value_dim()) + ", dtype='" +
               cpuattn::dtype_name(c.cache.dtype()) + "')";
      });
}

}  // namespace

void bind_paged(py::module_& m) {
  bind_cache(m);
  m.def(
      "attention_paged",
      [](const py::handle& q, const py::handle& k_pages, const py::handle& v_pages,
         const py::handle& block_table, const py::handle& seq_lens, const py::object& k_scales,
         const py::object& v_scales, const py::handle& is_causal, std::optional<double> scale,
         bool return_lse, const py::object& out, bool bf16,
         const std::optional<std::string>& kv_dtype, std::optional<int> threads, CtxHandle* context,
         const py::object& window_size, double softcap, bool alibi, const py::object& alibi_slopes,
         const py::object& sinks) {
        const VariantArgs va{window_size, alibi_slopes, sinks, softcap, alibi};
        return run_paged(false, q, k_pages, v_pages, block_table, seq_lens, k_scales, v_scales,
                         is_causal, scale, return_lse, out, bf16, kv_dtype, va,
                         pick_context(threads, context));
      },
      kPagedDoc, "q"_a, "k_pages"_a, "v_pages"_a, "block_table"_a, "seq_lens"_a, py::kw_only(),
      "k_scales"_a = py::none(), "v_scales"_a = py::none(), "is_causal"_a = false,
      "scale"_a = py::none(), "return_lse"_a = false, "out"_a = py::none(), "bf16"_a = false,
      "kv_dtype"_a = py::none(), "threads"_a = py::none(),
      "context"_a = static_cast<CtxHandle*>(nullptr), "window_size"_a = py::none(),
      "softcap"_a = 0.0, "alibi"_a = false, "alibi_slopes"_a = py::none(), "sinks"_a = py::none());
  m.def(
      "reference_attention_paged",
      [](const py::handle& q, const py::handle& k_pages, const py::handle& v_pages,
         const py::handle& block_table, const py::handle& seq_lens, const py::object& k_scales,
         const py::object& v_scales, const py::handle& is_causal, std::optional<double> scale,
         bool return_lse, const py::object& out, bool bf16,
         const std::optional<std::string>& kv_dtype, const py::object& window_size, double softcap,
         bool alibi, const py::object& alibi_slopes, const py::object& sinks) {
        const VariantArgs va{window_size, alibi_slopes, sinks, softcap, alibi};
        return run_paged(true, q, k_pages, v_pages, block_table, seq_lens, k_scales, v_scales,
                         is_causal, scale, return_lse, out, bf16, kv_dtype, va, nullptr);
      },
      "The double-precision oracle of attention_paged (float64 out by default).", "q"_a,
      "k_pages"_a, "v_pages"_a, "block_table"_a, "seq_lens"_a, py::kw_only(),
      "k_scales"_a = py::none(), "v_scales"_a = py::none(), "is_causal"_a = false,
      "scale"_a = py::none(), "return_lse"_a = false, "out"_a = py::none(), "bf16"_a = false,
      "kv_dtype"_a = py::none(), "window_size"_a = py::none(), "softcap"_a = 0.0, "alibi"_a = false,
      "alibi_slopes"_a = py::none(), "sinks"_a = py::none());
}

}  // namespace cpuattn_py
