// The C API (include/cpuattn/cpuattn_c.h) over the public C++ API. Every entry point runs its
// body inside guarded(), which catches every exception and turns it into a status and the calling
// thread's last-error message: no exception crosses into C. Results (`*out`) are assigned as the
// last, non-throwing step of a body, so a failure leaves them untouched.
//
// Values that come from C are read without trusting their type: a C caller may pass any int as an
// enum (loading an out-of-range value of a C++ enum is undefined behaviour), so enums are read
// through memcpy as integers and checked, and versioned structs are read field by field within
// struct_size (never as a whole struct that may be shorter than ours).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "cpuattn/cpuattn_c.h"
#include "cpuattn/layers.h"
#include "dispatch/dispatch.h"

#if !defined(CPUATTN_VERSION_MAJOR) || !defined(CPUATTN_VERSION_MINOR) || \
    !defined(CPUATTN_VERSION_PATCH) || !defined(CPUATTN_VERSION_STRING)
#error "lib/CMakeLists.txt passes the project version as CPUATTN_VERSION_* definitions"
#endif

struct cpuattn_context {
  cpuattn::Context context;
};
struct cpuattn_kv_cache {
  cpuattn::KvCache cache;
};
struct cpuattn_mha {
  cpuattn::MultiHeadAttention mha;
};
struct cpuattn_paged_kv_cache {
  cpuattn::PagedKvCache cache;
};

namespace {

using cpuattn::DType;

// ------------------------------------------------------------------------------- errors

struct LastError {
  std::string message;
  const char* fallback = nullptr;  // when recording the message itself ran out of memory
};

LastError& last_error() {
  thread_local LastError e;
  return e;
}

void set_error(const char* a, const char* b = "", const char* c = "") noexcept {
  LastError& e = last_error();
  try {
    e.message.assign(a);
    e.message.append(b);
    e.message.append(c);
    e.fallback = nullptr;
  } catch (...) {
    e.fallback = "cpuattn: out of memory (while recording an error message)";
  }
}

void clear_error() noexcept {
  LastError& e = last_error();
  e.message.clear();
  e.fallback = nullptr;
}

// A required pointer argument is NULL: CPUATTN_ERROR_NULL_POINTER. `name` is a literal.
struct NullPointer {
  const char* name;
};

template <class T>
T* need(T* p, const char* name) {
  if (p == nullptr) throw NullPointer{name};
  return p;
}

[[noreturn]] void fail(const std::string& what) { throw cpuattn::Error("cpuattn: " + what); }

template <class F>
cpuattn_status guarded(F&& body) noexcept {
  try {
    body();
    clear_error();
    return CPUATTN_OK;
  } catch (const NullPointer& e) {
    set_error("cpuattn: ", e.name, " is NULL");
    return CPUATTN_ERROR_NULL_POINTER;
  } catch (const cpuattn::Error& e) {
    set_error(e.what());
    return CPUATTN_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc& e) {
    set_error("cpuattn: out of memory (", e.what(), ")");
    return CPUATTN_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_error("cpuattn: internal error: ", e.what());
    return CPUATTN_ERROR_INTERNAL;
  } catch (...) {
    set_error("cpuattn: internal error: an exception that is not a std::exception");
    return CPUATTN_ERROR_INTERNAL;
  }
}

// ------------------------------------------------------------------------------- C values

// The integer a C caller stored in an enum object, without loading it as the C++ enum. C enum
// constants are ints, so the bits are read as a signed integer (a C caller's -5 stays -5).
template <class E>
long long raw(const E& e) {
  static_assert(std::is_enum_v<E>);
  std::make_signed_t<std::underlying_type_t<E>> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<long long>(v);
}

// `name` and `suffix` make the argument's name ("q" ".dtype"); nothing is allocated unless the
// check fails (the library allocates nothing per call in steady state, and neither does this API).
DType to_dtype(const cpuattn_dtype& d, const char* name, const char* suffix = "") {
  const long long v = raw(d);
  if (v < 0 || v >= cpuattn::kNumDTypes) {
    fail(std::string(name) + suffix + " " + std::to_string(v) + " is not a cpuattn_dtype (0 .. " +
         std::to_string(cpuattn::kNumDTypes - 1) + ")");
  }
  return static_cast<DType>(v);
}

cpuattn::Target to_target(const cpuattn_target& t, const char* name) {
  const long long v = raw(t);
  if (v < 0 || v > static_cast<long long>(cpuattn::detail::kLastTarget)) {
    fail(std::string(name) + " " + std::to_string(v) +
         " is not a cpuattn_target (CPUATTN_TARGET_SCALAR .. CPUATTN_TARGET_AVX512_VNNI)");
  }
  return static_cast<cpuattn::Target>(v);
}

cpuattn::Causal to_causal(const cpuattn_causal& c, const char* name) {
  const long long v = raw(c);
  if (v < 0 || v > static_cast<long long>(cpuattn::Causal::bottom_right)) {
    fail(std::string(name) + " " + std::to_string(v) +
         " is not a cpuattn_causal (CPUATTN_CAUSAL_NONE, _TOP_LEFT or _BOTTOM_RIGHT)");
  }
  return static_cast<cpuattn::Causal>(v);
}

// Shape and strides are copied as they are: the C++ API validates rank, sizes and strides (and
// names the argument); only the dtype, a C enum, is checked here.
template <class View>
View view_of(const cpuattn_tensor& t, const char* name) {
  View v;
  v.data = t.data;
  v.dtype = to_dtype(t.dtype, name, ".dtype");
  v.rank = t.rank;
  for (int d = 0; d < cpuattn::kMaxRank; ++d) {
    v.shape[d] = t.shape[d];
    v.strides[d] = t.strides[d];
  }
  return v;
}

cpuattn::TensorView in(const cpuattn_tensor* t, const char* name) {
  return view_of<cpuattn::TensorView>(*need(t, name), name);
}
cpuattn::OutputView out_view(const cpuattn_tensor* t, const char* name) {
  return view_of<cpuattn::OutputView>(*need(t, name), name);
}
std::optional<cpuattn::TensorView> optional_in(const cpuattn_tensor* t, const char* name) {
  if (t == nullptr) return std::nullopt;
  return view_of<cpuattn::TensorView>(*t, name);
}

cpuattn_tensor to_c(const cpuattn::TensorView& v) {
  cpuattn_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = const_cast<void*>(v.data);
  t.dtype = static_cast<cpuattn_dtype>(v.dtype);
  t.rank = v.rank;
  for (int d = 0; d < cpuattn::kMaxRank; ++d) {
    t.shape[d] = v.shape[d];
    t.strides[d] = v.strides[d];
  }
  return t;
}

// An absent scales view: data NULL, rank 0, the f32 dtype scales have.
cpuattn_tensor scales_of(const std::optional<cpuattn::TensorView>& v) {
  if (v) return to_c(*v);
  cpuattn::TensorView none;
  none.dtype = DType::f32;
  return to_c(none);
}

// ------------------------------------------------------------------------ versioned structs

// The largest struct_size accepted: anything larger is taken for an uninitialized field.
constexpr std::size_t kMaxStructSize = 4096;

// Checks p->struct_size against the rules of cpuattn_c.h and returns it. `name` is e.g.
// "options", `type` the C struct's name.
template <class S>
std::size_t checked_size(const S* p, std::size_t min_size, const char* name, const char* type) {
  std::size_t size = 0;
  std::memcpy(&size, reinterpret_cast<const unsigned char*>(p) + offsetof(S, struct_size),
              sizeof size);
  auto set_it = [&] {
    return std::string("; set it to sizeof(") + type + ") = " + std::to_string(sizeof(S)) +
           " (the *_init function does)";
  };
  if (size < min_size) {
    fail(std::string(name) + "->struct_size is " + std::to_string(size) +
         ", smaller than the smallest supported size " + std::to_string(min_size) + set_it());
  }
  if (size > kMaxStructSize) {
    fail(std::string(name) + "->struct_size is " + std::to_string(size) + ", larger than " +
         std::to_string(kMaxStructSize) + " (uninitialized?)" + set_it());
  }
  return size;
}

// A newer caller's struct: every byte this library does not know must be zero (the new fields at
// their defaults), else the caller asks for something this library cannot do.
template <class S>
void check_unknown_tail(const S* p, std::size_t size, const char* name, const char* type) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = sizeof(S); i < size; ++i) {
    if (bytes[i] != 0) {
      fail(std::string(name) + "->struct_size is " + std::to_string(size) + " but this library's " +
           type + " has " + std::to_string(sizeof(S)) + " bytes, and byte " + std::to_string(i) +
           " (a field of a newer version) is not zero");
    }
  }
}

// Reads a versioned struct: a value-initialized S (the defaults, all zero) with the fields that
// lie entirely within struct_size copied from *p.
template <class S>
class StructReader {
 public:
  StructReader(const S* p, std::size_t min_size, const char* name, const char* type)
      : p_(reinterpret_cast<const unsigned char*>(p)),
        size_(checked_size(p, min_size, name, type)) {
    check_unknown_tail(p, size_, name, type);
    std::memset(&s_, 0, sizeof s_);
    s_.struct_size = sizeof(S);
  }
  template <class F>
  void field(F S::*member) {
    F& f = s_.*member;
    const std::size_t offset = static_cast<std::size_t>(reinterpret_cast<unsigned char*>(&f) -
                                                        reinterpret_cast<unsigned char*>(&s_));
    if (offset + sizeof(F) <= size_) std::memcpy(&f, p_ + offset, sizeof(F));
  }
  const S& get() const { return s_; }

 private:
  const unsigned char* p_;
  std::size_t size_;
  S s_;
};

cpuattn::AttentionOptions to_options(const cpuattn_attention_options* p) {
  cpuattn::AttentionOptions o;
  if (p == nullptr) return o;
  StructReader<cpuattn_attention_options> r(p, CPUATTN_ATTENTION_OPTIONS_MIN_SIZE, "options",
                                            "cpuattn_attention_options");
  r.field(&cpuattn_attention_options::has_scale);
  r.field(&cpuattn_attention_options::scale);
  r.field(&cpuattn_attention_options::causal);
  r.field(&cpuattn_attention_options::mask);
  r.field(&cpuattn_attention_options::key_lengths);
  r.field(&cpuattn_attention_options::k_scales);
  r.field(&cpuattn_attention_options::v_scales);
  r.field(&cpuattn_attention_options::lse);
  r.field(&cpuattn_attention_options::weights);
  r.field(&cpuattn_attention_options::has_window);
  r.field(&cpuattn_attention_options::window_left);
  r.field(&cpuattn_attention_options::window_right);
  r.field(&cpuattn_attention_options::softcap);
  r.field(&cpuattn_attention_options::alibi);
  r.field(&cpuattn_attention_options::alibi_slopes);
  r.field(&cpuattn_attention_options::sinks);
  const cpuattn_attention_options& s = r.get();
  if (s.has_scale) o.scale = s.scale;
  o.causal = to_causal(s.causal, "options->causal");
  o.mask = optional_in(s.mask, "options->mask");
  o.key_lengths = optional_in(s.key_lengths, "options->key_lengths");
  o.k_scales = optional_in(s.k_scales, "options->k_scales");
  o.v_scales = optional_in(s.v_scales, "options->v_scales");
  if (s.lse) o.lse = out_view(s.lse, "options->lse");
  if (s.weights) o.weights = out_view(s.weights, "options->weights");
  if (s.has_window) {
    o.window_left = s.window_left;
    o.window_right = s.window_right;
  }
  o.softcap = s.softcap;
  o.alibi = s.alibi != 0;
  o.alibi_slopes = optional_in(s.alibi_slopes, "options->alibi_slopes");
  o.sinks = optional_in(s.sinks, "options->sinks");
  return o;
}

// A paged cache's views from C: the versioned struct read within struct_size; a scales tensor
// whose data is NULL is absent.
cpuattn::PagedKv to_paged(const cpuattn_paged_kv* p) {
  StructReader<cpuattn_paged_kv> r(need(p, "kv"), CPUATTN_PAGED_KV_MIN_SIZE, "kv",
                                   "cpuattn_paged_kv");
  r.field(&cpuattn_paged_kv::k_pages);
  r.field(&cpuattn_paged_kv::v_pages);
  r.field(&cpuattn_paged_kv::block_table);
  r.field(&cpuattn_paged_kv::seq_lens);
  r.field(&cpuattn_paged_kv::k_scales);
  r.field(&cpuattn_paged_kv::v_scales);
  const cpuattn_paged_kv& s = r.get();
  cpuattn::PagedKv kv;
  kv.k_pages = view_of<cpuattn::TensorView>(s.k_pages, "kv->k_pages");
  kv.v_pages = view_of<cpuattn::TensorView>(s.v_pages, "kv->v_pages");
  kv.block_table = view_of<cpuattn::TensorView>(s.block_table, "kv->block_table");
  kv.seq_lens = view_of<cpuattn::TensorView>(s.seq_lens, "kv->seq_lens");
  if (s.k_scales.data != nullptr)
    kv.k_scales = view_of<cpuattn::TensorView>(s.k_scales, "kv->k_scales");
  if (s.v_scales.data != nullptr)
    kv.v_scales = view_of<cpuattn::TensorView>(s.v_scales, "kv->v_scales");
  return kv;
}

std::vector<std::int64_t> seq_ids(const int64_t* seqs, int64_t n) {
  if (n < 0) fail("n = " + std::to_string(n) + " sequences; expected n >= 0");
  if (n > 0) need(seqs, "seqs");
  return std::vector<std::int64_t>(seqs, seqs + n);
}

cpuattn::Context* context_of(cpuattn_context* c) { return c ? &c->context : nullptr; }
const cpuattn::Context& context_or_default(const cpuattn_context* c) {
  return c ? c->context : cpuattn::default_context();
}

// Static cache scales from C: n floats each (0: per-token scales; the pointers may then be
// NULL).
cpuattn::KvScales to_scales(const float* k, const float* v, std::int64_t n) {
  if (n < 0) fail("n_scales = " + std::to_string(n) + " must be >= 0");
  if (n == 0) return {};
  need(k, "k_scales");
  need(v, "v_scales");
  return {std::vector<float>(k, k + n), std::vector<float>(v, v + n)};
}

// The C config with its zeros read as the C++ defaults (cpuattn_c.h); the C++ constructor checks
// the values. Enum fields are passed on as they are, so an out-of-range one is its Error.
cpuattn::MhaConfig mha_config_from_c(const cpuattn_mha_config& c) {
  cpuattn::MhaConfig m;
  m.d_model = c.d_model;
  m.heads = c.heads;
  m.kv_heads = c.kv_heads;
  m.head_dim = c.head_dim;
  m.value_dim = c.value_dim;
  const auto or_default = [](auto v, auto def) { return v == 0 ? def : v; };
  if (c.rope_base != 0) {
    cpuattn::RopeOptions r;
    r.base = c.rope_base;
    r.rotary_dim = c.rope_rotary_dim;
    r.style = static_cast<cpuattn::RopeStyle>(c.rope_style);
    cpuattn::RopeScaling& sc = r.scaling;
    sc.type = static_cast<cpuattn::RopeScalingType>(c.rope_scaling);
    sc.factor = or_default(c.rope_factor, sc.factor);
    sc.original_max_position = or_default(c.rope_original_max_position, sc.original_max_position);
    sc.low_freq_factor = or_default(c.rope_low_freq_factor, sc.low_freq_factor);
    sc.high_freq_factor = or_default(c.rope_high_freq_factor, sc.high_freq_factor);
    sc.beta_fast = or_default(c.rope_beta_fast, sc.beta_fast);
    sc.beta_slow = or_default(c.rope_beta_slow, sc.beta_slow);
    sc.attention_factor = c.rope_attention_factor;
    m.rope = r;
  }
  m.qk_norm = static_cast<cpuattn::QkNorm>(c.qk_norm);
  m.qk_norm_eps = or_default(c.qk_norm_eps, m.qk_norm_eps);
  return m;
}

}  // namespace

// ===================================================================================== C API

extern "C" {

const char* cpuattn_status_name(cpuattn_status status) {
  switch (raw(status)) {
    case CPUATTN_OK:
      return "ok";
    case CPUATTN_ERROR_INVALID_ARGUMENT:
      return "invalid_argument";
    case CPUATTN_ERROR_OUT_OF_MEMORY:
      return "out_of_memory";
    case CPUATTN_ERROR_NULL_POINTER:
      return "null_pointer";
    case CPUATTN_ERROR_INTERNAL:
      return "internal";
    default:
      return "unknown";
  }
}

const char* cpuattn_last_error(void) {
  const LastError& e = last_error();
  return e.fallback ? e.fallback : e.message.c_str();
}

void cpuattn_version(int* major, int* minor, int* patch) {
  if (major) *major = CPUATTN_VERSION_MAJOR;
  if (minor) *minor = CPUATTN_VERSION_MINOR;
  if (patch) *patch = CPUATTN_VERSION_PATCH;
}

const char* cpuattn_version_string(void) { return CPUATTN_VERSION_STRING; }

int cpuattn_c_api_version(void) { return CPUATTN_C_API_VERSION; }

const char* cpuattn_dtype_name(cpuattn_dtype dtype) {
  const long long v = raw(dtype);
  if (v < 0 || v >= cpuattn::kNumDTypes) return "unknown";
  return cpuattn::dtype_name(static_cast<DType>(v));
}

const char* cpuattn_target_name(cpuattn_target target) {
  const long long v = raw(target);
  if (v < 0 || v > static_cast<long long>(cpuattn::detail::kLastTarget)) return "unknown";
  return cpuattn::target_name(static_cast<cpuattn::Target>(v));
}

// ------------------------------------------------------------------------------- tensors

cpuattn_status cpuattn_tensor_contiguous(cpuattn_tensor* tensor, void* data, cpuattn_dtype dtype,
                                         int rank, const int64_t* shape) {
  return guarded([&] {
    need(tensor, "tensor");
    if (rank < 0 || rank > CPUATTN_MAX_RANK) {
      fail("cpuattn_tensor_contiguous: rank " + std::to_string(rank) + " is not in 0..4");
    }
    if (rank > 0) need(shape, "shape");
    const DType d = to_dtype(dtype, "dtype");
    // BasicView::contiguous multiplies all the sizes: check the products here (a signed
    // overflow there would be undefined behaviour); sizes are validated where the view is used.
    std::int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      if (__builtin_mul_overflow(stride, shape[i], &stride)) {
        fail("cpuattn_tensor_contiguous: the strides of a shape with dimension " +
             std::to_string(i) + " of size " + std::to_string(shape[i]) + " overflow 64 bits");
      }
    }
    const auto v = cpuattn::OutputView::contiguous(data, d, shape, rank);
    *tensor = to_c(v);
  });
}

cpuattn_status cpuattn_tensor_blhd(cpuattn_tensor* tensor, void* data, cpuattn_dtype dtype,
                                   int64_t B, int64_t L, int64_t H, int64_t D) {
  return guarded([&] {
    need(tensor, "tensor");
    const DType d = to_dtype(dtype, "dtype");
    std::int64_t lh = 0, lhd = 0, hd = 0;
    if (__builtin_mul_overflow(L, H, &lh) || __builtin_mul_overflow(lh, D, &lhd) ||
        __builtin_mul_overflow(H, D, &hd)) {
      fail("cpuattn_tensor_blhd: B=" + std::to_string(B) + " L=" + std::to_string(L) +
           " H=" + std::to_string(H) + " D=" + std::to_string(D) + ": strides overflow 64 bits");
    }
    *tensor = to_c(cpuattn::OutputView::blhd(data, d, B, L, H, D));
  });
}

// ------------------------------------------------------------------------------- contexts

cpuattn_status cpuattn_context_create(int num_threads, cpuattn_context** out) {
  return guarded([&] {
    need(out, "out");
    auto c = std::unique_ptr<cpuattn_context>(new cpuattn_context{cpuattn::Context(num_threads)});
    *out = c.release();
  });
}

void cpuattn_context_destroy(cpuattn_context* context) { delete context; }

cpuattn_status cpuattn_context_set_max_target(cpuattn_context* context, cpuattn_target target) {
  return guarded([&] {
    const cpuattn::Target t = to_target(target, "target");
    (context ? context->context : cpuattn::default_context()).set_max_target(t);
  });
}

cpuattn_status cpuattn_context_max_target(const cpuattn_context* context, cpuattn_target* out) {
  return guarded([&] {
    need(out, "out");
    *out = static_cast<cpuattn_target>(context_or_default(context).max_target());
  });
}

cpuattn_status cpuattn_context_num_threads(const cpuattn_context* context, int* out) {
  return guarded([&] {
    need(out, "out");
    *out = context_or_default(context).num_threads();
  });
}

cpuattn_status cpuattn_active_target(const cpuattn_context* context, cpuattn_target* out) {
  return guarded([&] {
    need(out, "out");
    *out =
        static_cast<cpuattn_target>(cpuattn::active_target(context ? &context->context : nullptr));
  });
}

cpuattn_status cpuattn_supported_targets(const char** out) {
  return guarded([&] {
    need(out, "out");
    static const std::string targets = cpuattn::supported_targets();
    *out = targets.c_str();
  });
}

// ------------------------------------------------------------------------------- attention

void cpuattn_attention_options_init(cpuattn_attention_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->has_scale = 0;
  options->scale = 0.0;
  options->causal = CPUATTN_CAUSAL_NONE;
  options->mask = options->key_lengths = options->k_scales = options->v_scales = nullptr;
  options->lse = options->weights = nullptr;
  options->has_window = 0;
  options->window_left = options->window_right = -1;
  options->softcap = 0.0;
  options->alibi = 0;
  options->alibi_slopes = options->sinks = nullptr;
}

cpuattn_status cpuattn_attention(const cpuattn_tensor* q, const cpuattn_tensor* k,
                                 const cpuattn_tensor* v, const cpuattn_tensor* out,
                                 const cpuattn_attention_options* options,
                                 cpuattn_context* context) {
  return guarded([&] {
    const auto qv = in(q, "q"), kv = in(k, "k"), vv = in(v, "v");
    const auto ov = out_view(out, "out");
    cpuattn::attention(qv, kv, vv, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_reference_attention(const cpuattn_tensor* q, const cpuattn_tensor* k,
                                           const cpuattn_tensor* v, const cpuattn_tensor* out,
                                           const cpuattn_attention_options* options) {
  return guarded([&] {
    const auto qv = in(q, "q"), kv = in(k, "k"), vv = in(v, "v");
    const auto ov = out_view(out, "out");
    cpuattn::reference_attention(qv, kv, vv, ov, to_options(options));
  });
}

cpuattn_status cpuattn_attention_varlen(const cpuattn_tensor* q, const cpuattn_tensor* k,
                                        const cpuattn_tensor* v, const cpuattn_tensor* out,
                                        const cpuattn_tensor* cu_seqlens_q,
                                        const cpuattn_tensor* cu_seqlens_k,
                                        const cpuattn_attention_options* options,
                                        cpuattn_context* context) {
  return guarded([&] {
    const auto qv = in(q, "q"), kv = in(k, "k"), vv = in(v, "v");
    const auto cq = in(cu_seqlens_q, "cu_seqlens_q"), ck = in(cu_seqlens_k, "cu_seqlens_k");
    const auto ov = out_view(out, "out");
    cpuattn::attention_varlen(qv, kv, vv, ov, cq, ck, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_reference_attention_varlen(const cpuattn_tensor* q, const cpuattn_tensor* k,
                                                  const cpuattn_tensor* v,
                                                  const cpuattn_tensor* out,
                                                  const cpuattn_tensor* cu_seqlens_q,
                                                  const cpuattn_tensor* cu_seqlens_k,
                                                  const cpuattn_attention_options* options) {
  return guarded([&] {
    const auto qv = in(q, "q"), kv = in(k, "k"), vv = in(v, "v");
    const auto cq = in(cu_seqlens_q, "cu_seqlens_q"), ck = in(cu_seqlens_k, "cu_seqlens_k");
    const auto ov = out_view(out, "out");
    cpuattn::reference_attention_varlen(qv, kv, vv, ov, cq, ck, to_options(options));
  });
}

// ------------------------------------------------------------------------- paged KV caches

void cpuattn_paged_kv_init(cpuattn_paged_kv* kv) {
  if (kv == nullptr) return;
  std::memset(kv, 0, sizeof *kv);
  kv->struct_size = sizeof *kv;
}

cpuattn_status cpuattn_attention_paged(const cpuattn_tensor* q, const cpuattn_paged_kv* kv,
                                       const cpuattn_tensor* out,
                                       const cpuattn_attention_options* options,
                                       cpuattn_context* context) {
  return guarded([&] {
    const auto qv = in(q, "q");
    const cpuattn::PagedKv pk = to_paged(kv);
    const auto ov = out_view(out, "out");
    cpuattn::attention(qv, pk, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_reference_attention_paged(const cpuattn_tensor* q,
                                                 const cpuattn_paged_kv* kv,
                                                 const cpuattn_tensor* out,
                                                 const cpuattn_attention_options* options) {
  return guarded([&] {
    const auto qv = in(q, "q");
    const cpuattn::PagedKv pk = to_paged(kv);
    const auto ov = out_view(out, "out");
    cpuattn::reference_attention(qv, pk, ov, to_options(options));
  });
}

cpuattn_status cpuattn_paged_kv_cache_create(int64_t num_pages, int64_t page_size, int64_t kv_heads,
                                             int64_t head_dim, int64_t value_dim,
                                             cpuattn_dtype dtype, cpuattn_paged_kv_cache** out) {
  return guarded([&] {
    need(out, "out");
    const DType d = to_dtype(dtype, "dtype");
    auto c = std::unique_ptr<cpuattn_paged_kv_cache>(new cpuattn_paged_kv_cache{
        cpuattn::PagedKvCache(num_pages, page_size, kv_heads, head_dim, value_dim, d)});
    *out = c.release();
  });
}

cpuattn_status cpuattn_paged_kv_cache_create_scaled(int64_t num_pages, int64_t page_size,
                                                    int64_t kv_heads, int64_t head_dim,
                                                    int64_t value_dim, cpuattn_dtype dtype,
                                                    const float* k_scales, const float* v_scales,
                                                    int64_t n_scales,
                                                    cpuattn_paged_kv_cache** out) {
  return guarded([&] {
    need(out, "out");
    const DType d = to_dtype(dtype, "dtype");
    const cpuattn::KvScales scales = to_scales(k_scales, v_scales, n_scales);
    auto c = std::unique_ptr<cpuattn_paged_kv_cache>(new cpuattn_paged_kv_cache{
        cpuattn::PagedKvCache(num_pages, page_size, kv_heads, head_dim, value_dim, d, scales)});
    *out = c.release();
  });
}

void cpuattn_paged_kv_cache_destroy(cpuattn_paged_kv_cache* cache) { delete cache; }

cpuattn_status cpuattn_paged_kv_cache_add_sequence(cpuattn_paged_kv_cache* cache, int64_t* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = cache->cache.add_sequence();
  });
}

cpuattn_status cpuattn_paged_kv_cache_fork(cpuattn_paged_kv_cache* cache, int64_t seq,
                                           int64_t length, int64_t* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = cache->cache.fork(seq, length < 0 ? std::nullopt : std::optional<std::int64_t>(length));
  });
}

cpuattn_status cpuattn_paged_kv_cache_append(cpuattn_paged_kv_cache* cache, int64_t seq,
                                             const cpuattn_tensor* k, const cpuattn_tensor* v) {
  return guarded([&] {
    need(cache, "cache");
    const auto kv = in(k, "k"), vv = in(v, "v");
    cache->cache.append(seq, kv, vv);
  });
}

cpuattn_status cpuattn_paged_kv_cache_truncate(cpuattn_paged_kv_cache* cache, int64_t seq,
                                               int64_t length) {
  return guarded([&] { need(cache, "cache")->cache.truncate(seq, length); });
}

cpuattn_status cpuattn_paged_kv_cache_free_sequence(cpuattn_paged_kv_cache* cache, int64_t seq) {
  return guarded([&] { need(cache, "cache")->cache.free(seq); });
}

cpuattn_status cpuattn_paged_kv_cache_length(const cpuattn_paged_kv_cache* cache, int64_t seq,
                                             int64_t* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = cache->cache.length(seq);
  });
}

cpuattn_status cpuattn_paged_kv_cache_free_pages(const cpuattn_paged_kv_cache* cache,
                                                 int64_t* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = cache->cache.free_pages();
  });
}

cpuattn_status cpuattn_paged_kv_cache_pages(const cpuattn_paged_kv_cache* cache, int64_t seq,
                                            int32_t* ids, int64_t capacity, int64_t* count) {
  return guarded([&] {
    need(cache, "cache");
    need(count, "count");
    if (capacity < 0) fail("capacity = " + std::to_string(capacity) + "; expected >= 0");
    if (capacity > 0) need(ids, "ids");
    const std::vector<std::int32_t> pages = cache->cache.pages(seq);
    const auto n = static_cast<std::int64_t>(pages.size());
    std::copy(pages.begin(), pages.begin() + std::min(n, capacity), ids);
    *count = n;
  });
}

cpuattn_status cpuattn_paged_kv_cache_batch(cpuattn_paged_kv_cache* cache, const int64_t* seqs,
                                            int64_t n, cpuattn_paged_kv* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    const std::size_t size =
        checked_size(out, CPUATTN_PAGED_KV_MIN_SIZE, "out", "cpuattn_paged_kv");
    const cpuattn::PagedKv kv = cache->cache.batch(seq_ids(seqs, n));
    auto* bytes = reinterpret_cast<unsigned char*>(out);
    auto put = [&](std::size_t offset, const cpuattn_tensor& t) {
      if (offset + sizeof t <= size) std::memcpy(bytes + offset, &t, sizeof t);
    };
    put(offsetof(cpuattn_paged_kv, k_pages), to_c(kv.k_pages));
    put(offsetof(cpuattn_paged_kv, v_pages), to_c(kv.v_pages));
    put(offsetof(cpuattn_paged_kv, block_table), to_c(kv.block_table));
    put(offsetof(cpuattn_paged_kv, seq_lens), to_c(kv.seq_lens));
    put(offsetof(cpuattn_paged_kv, k_scales), scales_of(kv.k_scales));
    put(offsetof(cpuattn_paged_kv, v_scales), scales_of(kv.v_scales));
  });
}

// ------------------------------------------------------------------------------- KV caches

cpuattn_status cpuattn_kv_cache_create(int64_t batch, int64_t kv_heads, int64_t head_dim,
                                       int64_t value_dim, int64_t capacity, int growable,
                                       cpuattn_dtype dtype, cpuattn_kv_cache** out) {
  return guarded([&] {
    need(out, "out");
    const DType d = to_dtype(dtype, "dtype");
    auto c = std::unique_ptr<cpuattn_kv_cache>(new cpuattn_kv_cache{
        cpuattn::KvCache(batch, kv_heads, head_dim, value_dim, capacity, growable != 0, d)});
    *out = c.release();
  });
}

cpuattn_status cpuattn_kv_cache_create_scaled(int64_t batch, int64_t kv_heads, int64_t head_dim,
                                              int64_t value_dim, int64_t capacity, int growable,
                                              cpuattn_dtype dtype, const float* k_scales,
                                              const float* v_scales, int64_t n_scales,
                                              cpuattn_kv_cache** out) {
  return guarded([&] {
    need(out, "out");
    const DType d = to_dtype(dtype, "dtype");
    const cpuattn::KvScales scales = to_scales(k_scales, v_scales, n_scales);
    auto c = std::unique_ptr<cpuattn_kv_cache>(new cpuattn_kv_cache{cpuattn::KvCache(
        batch, kv_heads, head_dim, value_dim, capacity, growable != 0, d, scales)});
    *out = c.release();
  });
}

void cpuattn_kv_cache_destroy(cpuattn_kv_cache* cache) { delete cache; }

cpuattn_status cpuattn_kv_cache_length(const cpuattn_kv_cache* cache, int64_t* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = cache->cache.length();
  });
}

cpuattn_status cpuattn_kv_cache_capacity(const cpuattn_kv_cache* cache, int64_t* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = cache->cache.capacity();
  });
}

cpuattn_status cpuattn_kv_cache_append(cpuattn_kv_cache* cache, const cpuattn_tensor* k,
                                       const cpuattn_tensor* v) {
  return guarded([&] {
    need(cache, "cache");
    const auto kv = in(k, "k"), vv = in(v, "v");
    cache->cache.append(kv, vv);
  });
}

cpuattn_status cpuattn_kv_cache_clear(cpuattn_kv_cache* cache) {
  return guarded([&] { need(cache, "cache")->cache.clear(); });
}

cpuattn_status cpuattn_kv_cache_truncate(cpuattn_kv_cache* cache, int64_t length) {
  return guarded([&] { need(cache, "cache")->cache.truncate(length); });
}

cpuattn_status cpuattn_kv_cache_reserve(cpuattn_kv_cache* cache, int64_t capacity) {
  return guarded([&] { need(cache, "cache")->cache.reserve(capacity); });
}

cpuattn_status cpuattn_kv_cache_keys(const cpuattn_kv_cache* cache, cpuattn_tensor* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = to_c(cache->cache.keys());
  });
}

cpuattn_status cpuattn_kv_cache_values(const cpuattn_kv_cache* cache, cpuattn_tensor* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = to_c(cache->cache.values());
  });
}

cpuattn_status cpuattn_kv_cache_key_scales(const cpuattn_kv_cache* cache, cpuattn_tensor* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = scales_of(cache->cache.key_scales());
  });
}

cpuattn_status cpuattn_kv_cache_value_scales(const cpuattn_kv_cache* cache, cpuattn_tensor* out) {
  return guarded([&] {
    need(cache, "cache");
    need(out, "out");
    *out = scales_of(cache->cache.value_scales());
  });
}

// ------------------------------------------------------------------------- multi-head attention

void cpuattn_mha_config_init(cpuattn_mha_config* config) {
  if (config == nullptr) return;
  std::memset(config, 0, sizeof *config);
  config->struct_size = sizeof *config;
}

void cpuattn_mha_weights_init(cpuattn_mha_weights* weights) {
  if (weights == nullptr) return;
  std::memset(weights, 0, sizeof *weights);
  weights->struct_size = sizeof *weights;
  weights->wq = weights->wk = weights->wv = weights->wo = nullptr;
  weights->bq = weights->bk = weights->bv = weights->bo = nullptr;
  weights->q_norm = weights->k_norm = nullptr;
}

cpuattn_status cpuattn_mha_create(const cpuattn_mha_config* config,
                                  const cpuattn_mha_weights* weights, cpuattn_mha** out) {
  return guarded([&] {
    need(config, "config");
    need(weights, "weights");
    need(out, "out");
    StructReader<cpuattn_mha_config> rc(config, CPUATTN_MHA_CONFIG_MIN_SIZE, "config",
                                        "cpuattn_mha_config");
    rc.field(&cpuattn_mha_config::d_model);
    rc.field(&cpuattn_mha_config::heads);
    rc.field(&cpuattn_mha_config::kv_heads);
    rc.field(&cpuattn_mha_config::head_dim);
    rc.field(&cpuattn_mha_config::value_dim);
    rc.field(&cpuattn_mha_config::rope_base);
    rc.field(&cpuattn_mha_config::rope_rotary_dim);
    rc.field(&cpuattn_mha_config::rope_style);
    rc.field(&cpuattn_mha_config::rope_scaling);
    rc.field(&cpuattn_mha_config::rope_factor);
    rc.field(&cpuattn_mha_config::rope_original_max_position);
    rc.field(&cpuattn_mha_config::rope_low_freq_factor);
    rc.field(&cpuattn_mha_config::rope_high_freq_factor);
    rc.field(&cpuattn_mha_config::rope_beta_fast);
    rc.field(&cpuattn_mha_config::rope_beta_slow);
    rc.field(&cpuattn_mha_config::rope_attention_factor);
    rc.field(&cpuattn_mha_config::qk_norm);
    rc.field(&cpuattn_mha_config::qk_norm_eps);
    StructReader<cpuattn_mha_weights> rw(weights, CPUATTN_MHA_WEIGHTS_MIN_SIZE, "weights",
                                         "cpuattn_mha_weights");
    rw.field(&cpuattn_mha_weights::wq);
    rw.field(&cpuattn_mha_weights::wk);
    rw.field(&cpuattn_mha_weights::wv);
    rw.field(&cpuattn_mha_weights::wo);
    rw.field(&cpuattn_mha_weights::bq);
    rw.field(&cpuattn_mha_weights::bk);
    rw.field(&cpuattn_mha_weights::bv);
    rw.field(&cpuattn_mha_weights::bo);
    rw.field(&cpuattn_mha_weights::q_norm);
    rw.field(&cpuattn_mha_weights::k_norm);
    const cpuattn_mha_config& c = rc.get();
    const cpuattn_mha_weights& w = rw.get();
    const cpuattn::MhaConfig config_cpp = mha_config_from_c(c);
    cpuattn::MhaWeights weights_cpp;
    weights_cpp.wq = in(w.wq, "weights->wq");
    weights_cpp.wk = in(w.wk, "weights->wk");
    weights_cpp.wv = in(w.wv, "weights->wv");
    weights_cpp.wo = in(w.wo, "weights->wo");
    weights_cpp.bq = optional_in(w.bq, "weights->bq");
    weights_cpp.bk = optional_in(w.bk, "weights->bk");
    weights_cpp.bv = optional_in(w.bv, "weights->bv");
    weights_cpp.bo = optional_in(w.bo, "weights->bo");
    weights_cpp.q_norm = optional_in(w.q_norm, "weights->q_norm");
    weights_cpp.k_norm = optional_in(w.k_norm, "weights->k_norm");
    auto m = std::unique_ptr<cpuattn_mha>(
        new cpuattn_mha{cpuattn::MultiHeadAttention(config_cpp, weights_cpp)});
    *out = m.release();
  });
}

void cpuattn_mha_destroy(cpuattn_mha* mha) { delete mha; }

cpuattn_status cpuattn_mha_get_config(const cpuattn_mha* mha, cpuattn_mha_config* out) {
  return guarded([&] {
    need(mha, "mha");
    need(out, "out");
    const std::size_t size =
        checked_size(out, CPUATTN_MHA_CONFIG_MIN_SIZE, "out", "cpuattn_mha_config");
    const cpuattn::MhaConfig& c = mha->mha.config();
    auto* bytes = reinterpret_cast<unsigned char*>(out);
    // Each field within struct_size (an older caller's struct is shorter).
    auto put = [&](std::size_t offset, auto value) {
      if (offset + sizeof value <= size) std::memcpy(bytes + offset, &value, sizeof value);
    };
    put(offsetof(cpuattn_mha_config, d_model), c.d_model);
    put(offsetof(cpuattn_mha_config, heads), c.heads);
    put(offsetof(cpuattn_mha_config, kv_heads), c.kv_heads);
    put(offsetof(cpuattn_mha_config, head_dim), c.head_dim);
    put(offsetof(cpuattn_mha_config, value_dim), c.value_dim);
    // The rotary and QK-norm fields with the defaults filled in (rope_base 0: no rotation).
    const cpuattn::RopeOptions r = c.rope.value_or(cpuattn::RopeOptions{.base = 0});
    put(offsetof(cpuattn_mha_config, rope_base), r.base);
    put(offsetof(cpuattn_mha_config, rope_rotary_dim), r.rotary_dim);
    put(offsetof(cpuattn_mha_config, rope_style), static_cast<std::int32_t>(r.style));
    put(offsetof(cpuattn_mha_config, rope_scaling), static_cast<std::int32_t>(r.scaling.type));
    put(offsetof(cpuattn_mha_config, rope_factor), r.scaling.factor);
    put(offsetof(cpuattn_mha_config, rope_original_max_position), r.scaling.original_max_position);
    put(offsetof(cpuattn_mha_config, rope_low_freq_factor), r.scaling.low_freq_factor);
    put(offsetof(cpuattn_mha_config, rope_high_freq_factor), r.scaling.high_freq_factor);
    put(offsetof(cpuattn_mha_config, rope_beta_fast), r.scaling.beta_fast);
    put(offsetof(cpuattn_mha_config, rope_beta_slow), r.scaling.beta_slow);
    put(offsetof(cpuattn_mha_config, rope_attention_factor), r.scaling.attention_factor);
    put(offsetof(cpuattn_mha_config, qk_norm), static_cast<std::int32_t>(c.qk_norm));
    put(offsetof(cpuattn_mha_config, qk_norm_eps), c.qk_norm_eps);
  });
}

cpuattn_status cpuattn_mha_forward(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                   const cpuattn_tensor* out,
                                   const cpuattn_attention_options* options,
                                   cpuattn_context* context) {
  return guarded([&] {
    need(mha, "mha");
    const auto xv = in(x, "x");
    const auto ov = out_view(out, "out");
    mha->mha.forward(xv, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_mha_forward_positions(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                             const cpuattn_tensor* positions,
                                             const cpuattn_tensor* out,
                                             const cpuattn_attention_options* options,
                                             cpuattn_context* context) {
  return guarded([&] {
    need(mha, "mha");
    const auto xv = in(x, "x"), pv = in(positions, "positions");
    const auto ov = out_view(out, "out");
    mha->mha.forward(xv, pv, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_mha_forward_varlen(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                          const cpuattn_tensor* cu_seqlens,
                                          const cpuattn_tensor* positions,
                                          const cpuattn_tensor* out,
                                          const cpuattn_attention_options* options,
                                          cpuattn_context* context) {
  return guarded([&] {
    need(mha, "mha");
    const auto xv = in(x, "x"), cv = in(cu_seqlens, "cu_seqlens");
    const auto pv = optional_in(positions, "positions");
    const auto ov = out_view(out, "out");
    if (pv) {
      mha->mha.forward_varlen(xv, cv, *pv, ov, to_options(options), context_of(context));
    } else {
      mha->mha.forward_varlen(xv, cv, ov, to_options(options), context_of(context));
    }
  });
}

cpuattn_status cpuattn_mha_forward_cross(const cpuattn_mha* mha, const cpuattn_tensor* xq,
                                         const cpuattn_tensor* xkv, const cpuattn_tensor* out,
                                         const cpuattn_attention_options* options,
                                         cpuattn_context* context) {
  return guarded([&] {
    need(mha, "mha");
    const auto qv = in(xq, "xq"), kvv = in(xkv, "xkv");
    const auto ov = out_view(out, "out");
    mha->mha.forward_cross(qv, kvv, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_mha_decode(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                  cpuattn_kv_cache* cache, const cpuattn_tensor* out,
                                  const cpuattn_attention_options* options,
                                  cpuattn_context* context) {
  return guarded([&] {
    need(mha, "mha");
    const auto xv = in(x, "x");
    need(cache, "cache");
    const auto ov = out_view(out, "out");
    mha->mha.decode(xv, cache->cache, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_mha_decode_paged(const cpuattn_mha* mha, const cpuattn_tensor* x,
                                        cpuattn_paged_kv_cache* cache, const int64_t* seqs,
                                        int64_t n, const cpuattn_tensor* out,
                                        const cpuattn_attention_options* options,
                                        cpuattn_context* context) {
  return guarded([&] {
    need(mha, "mha");
    const auto xv = in(x, "x");
    need(cache, "cache");
    const std::vector<std::int64_t> ids = seq_ids(seqs, n);
    const auto ov = out_view(out, "out");
    mha->mha.decode(xv, cache->cache, ids, ov, to_options(options), context_of(context));
  });
}

cpuattn_status cpuattn_mha_make_cache(const cpuattn_mha* mha, int64_t batch, int64_t capacity,
                                      int growable, cpuattn_dtype dtype, cpuattn_kv_cache** out) {
  return guarded([&] {
    need(mha, "mha");
    need(out, "out");
    const DType d = to_dtype(dtype, "dtype");
    auto c = std::unique_ptr<cpuattn_kv_cache>(
        new cpuattn_kv_cache{mha->mha.make_cache(batch, capacity, growable != 0, d)});
    *out = c.release();
  });
}

}  // extern "C"
