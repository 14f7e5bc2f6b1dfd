#include <tbb/global_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "api/context_impl.h"
#include "dispatch/dispatch.h"
#include "kernels/flash/config.h"

namespace cpuattn {

namespace {

// The names of an enum's values, in order, and the parsing every name-taking option shares.
constexpr const char* kTargetNames[] = {"scalar", "sse4", "avx2", "avx512",     "avx512_bf16",
                                        "best",   "neon", "sve",  "avx512_vnni"};
constexpr const char* kSimdNames[] = {"highway", "xsimd"};

template <class E, std::size_t N>
const char* name_of(E value, const char* const (&names)[N]) {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : "unknown";
}

template <class E, std::size_t N>
E parse_name(const std::string& name, const char* const (&names)[N], const char* what) {
  std::string expected;
  for (std::size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<E>(i);
    expected += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(names[i]);
  }
  throw Error("cpuattn: unknown " + std::string(what) + " '" + name + "'; expected " + expected);
}

}  // namespace

const char* target_name(Target target) { return name_of(target, kTargetNames); }

namespace {

// "scalar, sse4, avx2, avx512, avx512_vnni, avx512_bf16 or best" on x86-64: the caps this build
// accepts.
std::string architecture_target_list() {
  std::string s;
  for (Target t : detail::architecture_targets()) s += std::string(target_name(t)) + ", ";
  return s.substr(0, s.size() - 2) + " or best";
}

}  // namespace

Target parse_target(const std::string& name) {
  return parse_name<Target>(name, kTargetNames, "target");
}
const char* simd_name(Simd simd) { return name_of(simd, kSimdNames); }
Simd parse_simd(const std::string& name) {
  return parse_name<Simd>(name, kSimdNames, "SIMD provider");
}

Context::Context(int num_threads) : impl_(std::make_unique<Impl>()) {
  if (num_threads < 0) {
    throw Error("cpuattn: num_threads must be >= 0 (0 = the caller's arena), got " +
                std::to_string(num_threads));
  }
  impl_->num_threads = num_threads;
  // oneTBB never runs more threads than its global limit (the machine's cores by default); an
  // arena asking for more only made oneTBB print a warning on stderr. The plan does not depend on
  // the thread count, so capping it changes no result.
  if (num_threads > 0) {
    const int allowed = static_cast<int>(
        tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    impl_->arena = std::make_unique<tbb::task_arena>(std::min(num_threads, std::max(1, allowed)));
  }
}

Context::~Context() = default;

int Context::num_threads() const { return impl_->num_threads; }
void Context::set_max_target(Target target) {
  // Found by fuzz_validate: a value outside the enum indexed the dispatch table out of bounds.
  if (static_cast<unsigned>(target) > static_cast<unsigned>(detail::kLastTarget)) {
    throw Error("cpuattn: set_max_target: " + std::to_string(static_cast<int>(target)) +
                " is not a Target (" + architecture_target_list() + ")");
  }
  const auto own = detail::architecture_targets();
  if (target != Target::best && std::find(own.begin(), own.end(), target) == own.end()) {
    throw Error("cpuattn: set_max_target: '" + std::string(target_name(target)) +
                "' is not a target of this build's architecture (" + architecture_target_list() +
                ")");
  }
  impl_->max_target.store(target);
}
Target Context::max_target() const { return impl_->max_target.load(); }
void Context::set_simd(Simd simd) {
  if (static_cast<unsigned>(simd) > static_cast<unsigned>(Simd::xsimd)) {
    throw Error("cpuattn: set_simd: " + std::to_string(static_cast<int>(simd)) +
                " is not a Simd provider (highway or xsimd)");
  }
  impl_->simd.store(simd);
}
Simd Context::simd() const { return impl_->simd.load(); }

void Context::set_scratch_limit(std::size_t bytes) { impl_->scratch_limit.store(bytes); }
std::size_t Context::scratch_limit() const { return impl_->scratch_limit.load(); }

void Context::trim() {
  // clear() destroys every thread's slot, also those of threads that have exited since.
  impl_->task_scratch.clear();
  impl_->call_scratch.clear();
  impl_->layer_scratch.clear();
}

std::size_t Context::retained_scratch_bytes() const {
  std::size_t total = 0;
  for (const auto* ets : {&impl_->task_scratch, &impl_->call_scratch, &impl_->layer_scratch}) {
    for (const detail::Scratch& s : *ets) total += s.bytes();
  }
  return total;
}

Context& default_context() {
  // A plain static, destroyed at exit (so leak checkers see its scratch freed).
  static Context ctx(0);
  static const bool configured = [] {
    if (const char* env = std::getenv("CPUATTN_TARGET"); env != nullptr && *env != '\0') {
      try {
        ctx.set_max_target(parse_target(env));
      } catch (const Error& e) {
        std::fprintf(stderr, "%s (from CPUATTN_TARGET); using the best target\n", e.what());
      }
    }
    if (const char* env = std::getenv("CPUATTN_SIMD"); env != nullptr && *env != '\0') {
      try {
        ctx.set_simd(parse_simd(env));
      } catch (const Error& e) {
        std::fprintf(stderr, "%s (from CPUATTN_SIMD); using highway\n", e.what());
      }
    }
    return true;
  }();
  (void)configured;
  return ctx;
}

Target active_target(const Context* context) { return detail::choose(context).target; }
const char* active_bf16_path(const Context* context) {
  // The plan's rule (kernels/flash/config.cpp) for the tiled blocks of bf16 Q and K/V (a prefill:
  // 64 rows per K/V head, D 64).
  const detail::Choice& choice = detail::choose(context);
  if (detail::amx_tiles(choice, DType::bf16, DType::bf16, 64)) return "amx_bf16";
  const detail::FlashUnit unit = detail::choose_unit(choice, DType::bf16, DType::bf16, 64, 64);
  return unit == detail::FlashUnit::avx512_bf16 ? "avx512_bf16" : "f32";
}

Simd active_simd(const Context* context) { return detail::choose(context).provider; }

std::string supported_targets() {
  std::string s;
  Target last = Target::best;
  const auto own = detail::architecture_targets();
  for (auto it = own.rbegin(); it != own.rend(); ++it) {
    const Target cap = *it;
    const Target t = detail::choose(cap, Simd::highway).target;
    if (t == last) continue;
    if (!s.empty()) s += ",";
    s += target_name(t);
    last = t;
  }
  return s;
}

}  // namespace cpuattn
