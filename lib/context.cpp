#include <cstdio>
#include <cstdlib>
#include <string>

#include "context_impl.h"

namespace cpuattn {

const char* target_name(Target target) {
  switch (target) {
    case Target::scalar:
      return "scalar";
    case Target::sse4:
      return "sse4";
    case Target::avx2:
      return "avx2";
    case Target::avx512:
      return "avx512";
    case Target::best:
      return "best";
  }
  return "unknown";
}

Target parse_target(const std::string& name) {
  for (Target t : {Target::scalar, Target::sse4, Target::avx2, Target::avx512, Target::best}) {
    if (name == target_name(t)) return t;
  }
  throw Error("cpuattn: unknown target '" + name +
              "'; expected one of scalar, sse4, avx2, avx512, best");
}

Context::Context(int num_threads) : impl_(std::make_unique<Impl>()) {
  if (num_threads < 0) {
    throw Error("cpuattn: num_threads must be >= 0 (0 = the caller's arena), got " +
                std::to_string(num_threads));
  }
  impl_->num_threads = num_threads;
  // oneTBB never runs more worker threads than its global limit (the machine's cores by
  // default), so an arena larger than the machine does not oversubscribe it.
  if (num_threads > 0) impl_->arena = std::make_unique<tbb::task_arena>(num_threads);
}

Context::~Context() = default;

int Context::num_threads() const { return impl_->num_threads; }
void Context::set_max_target(Target target) { impl_->max_target.store(target); }
Target Context::max_target() const { return impl_->max_target.load(); }

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
    return true;
  }();
  (void)configured;
  return ctx;
}

Target active_target(const Context* context) {
  const Context& c = context != nullptr ? *context : default_context();
  return detail::kernels_for(c.max_target()).target;
}

std::string supported_targets() {
  std::string s;
  Target last = Target::best;
  for (Target cap : {Target::avx512, Target::avx2, Target::sse4, Target::scalar}) {
    const Target t = detail::kernels_for(cap).target;
    if (t == last) continue;
    if (!s.empty()) s += ",";
    s += target_name(t);
    last = t;
  }
  return s;
}

}  // namespace cpuattn
