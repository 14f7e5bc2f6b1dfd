#include "cli_util.h"

#include <sys/stat.h>

#include <cstdio>
#include <new>

#include "files.h"

namespace cpuattn::cli {

void fail(const std::string& message) { throw BadInput(message); }

void report(std::string message) {
  const std::string prefix = "cpuattn: ";
  while (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  constexpr std::size_t kMaxLine = 4096;
  std::string line;
  for (char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n' || c == '\r') {
      line += ' ';
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      line += buf;
    } else {
      line += ch;
    }
    if (line.size() > kMaxLine) {
      line.resize(kMaxLine);
      line += "...";
      break;
    }
  }
  std::fprintf(stderr, "cpuattn: %s\n", line.c_str());
}

void guarded(int& exit_code, const std::function<void()>& body) {
  try {
    body();
    exit_code = 0;
  } catch (const std::bad_alloc&) {
    report("out of memory");
    exit_code = 2;
  } catch (const std::exception& e) {  // cpuattn::Error, npy::Error, BadInput
    report(e.what());
    exit_code = 2;
  }
}

std::string named(const char* what, const std::string& path) {
  return std::string(what) + " (" + files::display(path) + ")";
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

npy::Array load_float(const char* what, const std::string& path, int min_rank, int max_rank,
                      const std::string& expected, bool keep_f64, bool keep_f16) {
  npy::Array a = npy::read(path);
  if (a.dtype != DType::f32 && a.dtype != DType::f64 && a.dtype != DType::f16) {
    fail(named(what, path) + " has dtype " + dtype_name(a.dtype) +
         "; expected float32, float64 or float16");
  }
  if (a.rank() < min_rank || a.rank() > max_rank) {
    fail(named(what, path) + " has shape " + npy::shape_str(a.shape) + "; expected " + expected);
  }
  for (std::int64_t d : a.shape) {
    if (d < 1) {
      fail(named(what, path) + " has shape " + npy::shape_str(a.shape) +
           "; every dimension must be at least 1");
    }
  }
  // float16 stays float16 only where the caller keeps reduced precision (cpuattn run).
  if ((a.dtype == DType::f64 && !keep_f64) || (a.dtype == DType::f16 && !keep_f16))
    a = npy::to_f32(a, named(what, path));
  return a;
}

npy::Array load_mask(const std::string& path, const std::vector<std::int64_t>& scores,
                     const std::string& scores_desc) {
  npy::Array mask = npy::read(path);
  if (mask.dtype == DType::f64) mask = npy::to_f32(mask, named("mask", path));
  if (mask.dtype != DType::boolean && mask.dtype != DType::f32) {
    fail(named("mask", path) + " has dtype " + dtype_name(mask.dtype) +
         "; expected bool (true = attend) or float32/float64 (added to the scores)");
  }
  const int rank = static_cast<int>(scores.size());
  if (mask.rank() < 1 || mask.rank() > rank) {
    fail(named("mask", path) + " has shape " + npy::shape_str(mask.shape) + "; expected rank 1.." +
         std::to_string(rank) + ", broadcastable to the scores " + npy::shape_str(scores));
  }
  // NumPy broadcasting in the inputs' rank: align trailing dimensions.
  const std::vector<std::int64_t> given = mask.shape;
  mask.shape.insert(mask.shape.begin(), static_cast<std::size_t>(rank - mask.rank()), 1);
  for (int d = 0; d < rank; ++d) {
    if (mask.shape[d] != 1 && mask.shape[d] != scores[d]) {
      fail(named("mask", path) + " of shape " + npy::shape_str(given) +
           " does not broadcast to the scores " + npy::shape_str(scores) + " (" + scores_desc +
           ")");
    }
  }
  return mask;
}

npy::Array load_key_lengths(const std::string& path, std::int64_t B, bool unbatched) {
  npy::Array lengths = npy::read(path);
  if (lengths.dtype != DType::i32 && lengths.dtype != DType::i64) {
    fail(named("key lengths", path) + " has dtype " + dtype_name(lengths.dtype) +
         "; expected int32 or int64");
  }
  if (lengths.rank() != 1 || lengths.shape[0] != B) {
    fail(named("key lengths", path) + " has shape " + npy::shape_str(lengths.shape) +
         "; expected (" + std::to_string(B) + ",), one length per batch" +
         (unbatched ? " (rank-2 inputs are one batch)" : ""));
  }
  return lengths;
}

void check_files(const NamedPaths& outputs, const NamedPaths& inputs) {
  auto clash = [](const std::pair<const char*, std::string>& a,
                  const std::pair<const char*, std::string>& b, const char* role) {
    if (a.second.empty() || b.second.empty()) return;
    bool same = false;
    try {
      same = files::same_file(a.second, b.second);
    } catch (const files::Error&) {
      return;  // a path that cannot be resolved fails later with its own message
    }
    if (same) {
      fail(std::string(a.first) + " '" + files::display(a.second) + "' and " + b.first + " '" +
           files::display(b.second) + "' are the same file; " + role);
    }
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      clash(outputs[i], outputs[j], "one output would overwrite the other");
    for (const auto& in : inputs) clash(outputs[i], in, "the output would overwrite an input");
  }
}

std::unique_ptr<Context> make_context(int threads, const std::string& simd) {
  auto context = std::make_unique<Context>(threads);
  context->set_max_target(active_target());
  context->set_simd(simd.empty() ? default_context().simd() : parse_simd(simd));
  return context;
}

CLI::Option* add_simd_option(CLI::App& cmd, std::string& simd) {
  return cmd
      .add_option("--simd", simd,
                  "SIMD library of the kernels: highway or xsimd (default: CPUATTN_SIMD, else "
                  "highway)")
      ->check(CLI::IsMember({"highway", "xsimd"}));
}

std::vector<std::string> target_cap_names() {
  // Every Target but best, worst to best per architecture (the enum's values are not that order:
  // names added later come after best).
  constexpr Target kAll[] = {Target::scalar,      Target::sse4,        Target::avx2, Target::avx512,
                             Target::avx512_vnni, Target::avx512_bf16, Target::neon, Target::sve};
  std::vector<std::string> names;
  Context probe(0);
  for (Target t : kAll) {
    try {
      probe.set_max_target(t);
    } catch (const Error&) {
      continue;  // another architecture's target
    }
    names.emplace_back(target_name(t));
  }
  names.emplace_back("best");
  return names;
}

std::string target_cap_list() {
  const auto names = target_cap_names();
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

CLI::Option* add_threads_option(CLI::App& cmd, int& threads) {
  return cmd
      .add_option("--threads", threads,
                  "Run on N threads (default: all cores; more than the cores runs on the cores). "
                  "Results do not depend on N")
      ->check(CLI::Range(1, 1 << 16))
      ->type_name("N");
}

std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace cpuattn::cli
