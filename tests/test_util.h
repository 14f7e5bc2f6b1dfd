// Helpers shared by the test suites: random tensors with fixed seeds, strided layouts, and the
// comparison against the double-precision reference with a tolerance that grows with the
// reduction length and reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CPUATTN_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CPUATTN_TEST_SANITIZED 1
#endif
#endif

namespace cpuattn::test {

// Whether the largest grids run thinned: in a sanitizer build (unless CPUATTN_FULL_GRID=1), and
// wherever CPUATTN_TEST_QUICK=1 (the emulated ARM runs of tools/check aarch64). The sanitizers
// find memory errors and UB that depend on the code path (sizes, tails, masks, targets, layouts),
// which a thinned grid still walks; running every case under ASan took about 10 of CI's 32
// minutes on 2 cores, and emulation is slower still. The release job runs every case.
inline bool thin_grids() {
  static const bool thin = [] {
    const char* quick = std::getenv("CPUATTN_TEST_QUICK");
    if (quick != nullptr && std::string(quick) == "1") return true;
#ifdef CPUATTN_TEST_SANITIZED
    const char* e = std::getenv("CPUATTN_FULL_GRID");
    return e == nullptr || std::string(e) != "1";
#else
    return false;
#endif
  }();
  return thin;
}

// Whether case n of a grid runs: every case, or in thinned grids every stride-th (a stride
// coprime to the periods of the grid's parameters, so each still takes every value).
inline bool grid_case_runs(int n, int stride) { return !thin_grids() || n % stride == 0; }

// The value of the first line of /proc/cpuinfo named `key` ("vendor_id", "flags"), without the
// name and the colon; empty where there is no such line. Tests that check a vendor or flag rule
// of the library read the CPU here, not through the CPUID the library reads.
inline std::string cpuinfo_field(const std::string& key) {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos || line.rfind(key, 0) != 0) continue;
    if (line.find_first_not_of(" \t", key.size()) != colon) continue;  // "flags" vs "flagsx"
    const std::size_t value = line.find_first_not_of(' ', colon + 1);
    return value == std::string::npos ? std::string() : line.substr(value);
  }
  return {};
}

// Whether the flags line of /proc/cpuinfo lists `flag`, a whole word.
inline bool cpuinfo_has_flag(const std::string& flag) {
  std::istringstream words(cpuinfo_field("flags"));
  for (std::string w; words >> w;)
    if (w == flag) return true;
  return false;
}

// Whether this CPU and build run target t (a cap of another architecture's target is refused, so
// a test asks this before it caps a Context at avx512_bf16). A cap that names avx512_bf16 runs
// the native unit's bf16 products on every CPU that has it (dispatch.cpp, compute()), which the
// native-unit tests assert after capping.
inline bool machine_runs(Target t) {
  Context c(0);
  try {
    c.set_max_target(t);
  } catch (const Error&) {
    return false;
  }
  return active_target(&c) == t;
}

// The targets this CPU runs, best first (avx512_bf16 has its own tests); a test caps a Context at
// each (Context::set_max_target).
inline std::vector<Target> machine_targets() {
  std::vector<Target> ts;
  for (Target t :
       {Target::avx512, Target::avx2, Target::sse4, Target::sve, Target::neon, Target::scalar}) {
    if (machine_runs(t)) ts.push_back(t);
  }
  return ts;
}

// Whether a context's bf16 paths multiply bf16 products (vdpbf16ps or AMX tiles, which round P to
// bf16), not widened f32: the native bounds of the tests' tolerances apply.
inline bool native_bf16_products(const Context* c) {
  return std::string(active_bf16_path(c)) != "f32";
}

// The targets whose int8 decoding steps run P V on VNNI (a native unit, which takes the weights
// rounded to int16).
inline constexpr Target kVnniTargets[] = {Target::avx512_vnni, Target::avx512_bf16};

// kVnniTargets where this CPU runs them.
inline std::vector<Target> vnni_targets() {
  std::vector<Target> ts;
  for (Target t : kVnniTargets)
    if (machine_runs(t)) ts.push_back(t);
  return ts;
}

// Whether a context's decoding steps over K/V of `kv` round P for native products: bf16 as
// native_bf16_products says; int8 on kVnniTargets.
inline bool native_products(const Context* c, DType kv) {
  if (kv != DType::i8) return native_bf16_products(c);
  const Target t = active_target(c);
  return std::find(std::begin(kVnniTargets), std::end(kVnniTargets), t) != std::end(kVnniTargets);
}

// A SIMD provider and a target cap: what a test runs the fast paths on.
struct Backend {
  Simd simd;
  Target target;
  void apply(Context& c) const {
    c.set_simd(simd);
    c.set_max_target(target);
  }
  std::string name() const { return std::string(simd_name(simd)) + "_" + target_name(target); }
};

inline void PrintTo(const Backend& b, std::ostream* os) { *os << b.name(); }

// Every (provider, target) this CPU runs: Highway on every target, xsimd on the SIMD ones.
inline std::vector<Backend> machine_backends() {
  std::vector<Backend> bs;
  for (Simd s : {Simd::highway, Simd::xsimd}) {
    for (Target t : machine_targets()) {
      Context c(0);
      const Backend b{s, t};
      b.apply(c);
      if (active_simd(&c) == s) bs.push_back(b);
    }
  }
  return bs;
}

// Every (provider, target) of the machine, plus the native bf16 and VNNI units where the CPU has
// them (the avx512 entries then run the portable paths: the cap), plus `best` where it runs what
// no cap names: bf16 tiles on AMX (active_bf16_path() "amx_bf16"). Highway's alone: the AMX units
// are the native unit's, the same under either provider, and the rest of `best` is the
// avx512_bf16 entries' (a sanitizer build's suite is long already). The avx512_vnni unit under
// xsimd alone: it is compiled with xsimd, and the rest of that target is the avx512 entries'.
inline std::vector<Backend> native_and_machine_backends() {
  std::vector<Backend> bs = machine_backends();
  if (machine_runs(Target::avx512_vnni))
    bs.insert(bs.begin(), Backend{Simd::xsimd, Target::avx512_vnni});
  if (machine_runs(Target::avx512_bf16)) {
    bs.insert(bs.begin(), Backend{Simd::highway, Target::avx512_bf16});
    bs.insert(bs.begin() + 1, Backend{Simd::xsimd, Target::avx512_bf16});
  }
  Context best(0);
  best.set_max_target(Target::best);
  if (std::string(active_bf16_path(&best)) == "amx_bf16") {
    bs.insert(bs.begin(), Backend{Simd::highway, Target::best});
  }
  return bs;
}

// Floats from a 64-byte boundary (the kernels' aligned operands: Qp rows, accumulators), the
// first x.size() of them x, the rest 0.
struct AlignedFloats {
  std::vector<float> buf;
  explicit AlignedFloats(std::size_t n) : buf(n + 16, 0.0f) {}
  explicit AlignedFloats(const std::vector<float>& x) : buf(x.size() + 16, 0.0f) {
    std::copy(x.begin(), x.end(), data());
  }
  float* data() {
    return buf.data() + (64 - reinterpret_cast<std::uintptr_t>(buf.data()) % 64) % 64 / 4;
  }
};

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A [B, H, L, D] tensor in one of two memory layouts: "bhld" (contiguous) or "blhd" (heads
// interleaved, as a projection writes them), starting `misalign` floats into its buffer so that
// the base pointer is not 64-byte aligned.
struct Tensor4 {
  std::vector<float> buf;
  std::int64_t B, H, L, D;
  bool blhd;
  int misalign;
  Tensor4(std::int64_t B_, std::int64_t H_, std::int64_t L_, std::int64_t D_, bool blhd_ = false,
          int misalign_ = 0)
      : buf(static_cast<std::size_t>(B_ * H_ * L_ * D_ + misalign_), 0.0f),
        B(B_),
        H(H_),
        L(L_),
        D(D_),
        blhd(blhd_),
        misalign(misalign_) {}
  float* data() { return buf.data() + misalign; }
  const float* data() const { return buf.data() + misalign; }
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t d) const {
    return blhd ? ((b * L + l) * H + h) * D + d : ((b * H + h) * L + l) * D + d;
  }
  float& at(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t d) {
    return data()[offset(b, h, l, d)];
  }
  float at(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t d) const {
    return data()[offset(b, h, l, d)];
  }
  TensorView view() const {
    return blhd ? TensorView::blhd(data(), DType::f32, B, L, H, D)
                : TensorView::contiguous(data(), DType::f32, {B, H, L, D});
  }
  OutputView out_view() {
    return blhd ? OutputView::blhd(data(), DType::f32, B, L, H, D)
                : OutputView::contiguous(data(), DType::f32, {B, H, L, D});
  }
  void fill_random(std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    auto r = random_floats(buf.size(), seed, lo, hi);
    std::copy(r.begin(), r.end(), buf.begin());
  }
};

// Compares `got` with the reference `want` elementwise: |got - want| <= atol + rtol * |want|,
// where the caller scales atol with the reduction length (sqrt(n) * eps * magnitude). NaN must
// match NaN. Reports the worst element by its flat index.
inline ::testing::AssertionResult all_close(const float* got, const float* want, std::size_t n,
                                            double atol, double rtol = 1e-5) {
  double worst = -1;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) {
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << g << ", want " << w << " (NaN mismatch)";
      }
      continue;
    }
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) {
        return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", want " << w;
      }
      continue;
    }
    const double excess = std::abs(g - w) - (atol + rtol * std::abs(w));
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  if (worst > 0) {
    return ::testing::AssertionFailure()
           << "worst element " << worst_i << " of " << n << ": got " << got[worst_i] << ", want "
           << want[worst_i] << ", |diff| = " << std::abs(double(got[worst_i]) - want[worst_i])
           << " > atol " << atol << " + rtol " << rtol << " * |want|";
  }
  return ::testing::AssertionSuccess();
}

// f() must throw cpuattn::Error whose message contains `needle`.
template <class F>
void expect_error_mentioning(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace cpuattn::test
