// Helpers shared by the subcommands that compute on .npy files (`run`, `mha`): error reporting,
// loading and checking inputs, viewing low-rank arrays as the library's shapes, and the owned
// execution context. Every check throws BadInput (or lets npy::Error / cpuattn::Error through);
// guarded() turns any of them into one line on stderr and exit code 2.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "npy.h"

namespace cpuattn::cli {

// Bad input found by a command (the library and npy throw their own errors).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& message);

// Prints `message` as one line "cpuattn: ..." on stderr (the library's own "cpuattn: " prefix is
// not repeated, line breaks become spaces, other control characters are escaped as \xNN and the
// line is cut at 4096 bytes): nothing a file name contains can drive the terminal.
void report(std::string message);

// Runs `body` and sets exit_code: 0 on success, 2 (after report()) on any exception.
void guarded(int& exit_code, const std::function<void()>& body);

// "Q (q.npy)" for messages, the path shown with files::display.
std::string named(const char* what, const std::string& path);

bool path_exists(const std::string& path);

// Reads a float32/float64 array of rank min_rank..max_rank with no empty dimension; `expected`
// describes the accepted shapes for the message (e.g. "rank 2 [L, D] or 3 [B, L, D]").
// Converted to float32 unless `keep_f64`.
npy::Array load_float(const char* what, const std::string& path, int min_rank, int max_rank,
                      const std::string& expected, bool keep_f64 = false, bool keep_f16 = false);

// Reads a mask file: bool, or float32/float64 (converted to float32), broadcastable (NumPy rules)
// to `scores` (the scores' shape in the inputs' rank, `scores_desc` names it for messages). The
// result has the rank of `scores` (leading dimensions of size 1 added).
npy::Array load_mask(const std::string& path, const std::vector<std::int64_t>& scores,
                     const std::string& scores_desc);

// Reads key lengths: int32/int64 of shape [B]. `unbatched`: the inputs have no batch axis (B = 1).
npy::Array load_key_lengths(const std::string& path, std::int64_t B, bool unbatched);

// (option, path) pairs; an empty path is an option not given.
using NamedPaths = std::vector<std::pair<const char*, std::string>>;
// Fails before anything runs if two outputs, or an output and an input, are the same file
// (files::same_file: device and inode, or the same name in the same directory; symlinks followed),
// so one output never silently overwrites another or an input. Inputs may share a file.
void check_files(const NamedPaths& outputs, const NamedPaths& inputs);

// An owned context on `threads` threads (0 = the caller's arena) with the default context's
// target and SIMD provider, so that CPUATTN_TARGET and CPUATTN_SIMD still apply. Owning it frees
// its scratch memory at exit; the never-destroyed default context shows up as a leak under
// LeakSanitizer.
// `simd` names the provider ("" = the default context's).
std::unique_ptr<Context> make_context(int threads, const std::string& simd = "");
// The --threads N option (for make_context).
CLI::Option* add_threads_option(CLI::App& cmd, int& threads);
// The --simd highway|xsimd option (for make_context).
CLI::Option* add_simd_option(CLI::App& cmd, std::string& simd);
// The target caps this build accepts (its architecture's targets, worst to best, then "best"),
// and the same as "scalar, sse4, ... or best" for help texts.
std::vector<std::string> target_cap_names();
std::string target_cap_list();

std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last);

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

// [.., Lq] of rank 1..3 as [B, H, Lq].
template <class View>
View as_bhl(const View& t) {
  if (t.rank == 1) return place(t, 3, {2});
  if (t.rank == 2) return place(t, 3, {0, 2});
  return t;
}

// [L, X] as [1, L, X]; rank 3 as is.
template <class View>
View as_blx(const View& t) {
  return t.rank == 2 ? place(t, 3, {1, 2}) : t;
}

}  // namespace cpuattn::cli
