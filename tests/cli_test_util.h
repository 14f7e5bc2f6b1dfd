// Helpers for end-to-end tests of the `cpuattn` binary (CPUATTN_CLI_PATH): a fixture that runs
// it in a temporary directory on .npy files, checks of successful and failing runs, and float
// comparisons.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "npy.h"

#ifndef CPUATTN_CLI_PATH
#error "CPUATTN_CLI_PATH must be defined to the path of the cpuattn binary"
#endif

namespace cpuattn::cli_test {

using Shape = std::vector<std::int64_t>;

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// `values` (row-major, of `shape`) as a float32 or float64 array.
inline npy::Array make(const Shape& shape, const std::vector<double>& values,
                       DType dtype = DType::f32) {
  if (dtype == DType::f64) return npy::from_values(shape, values);
  return npy::from_values(shape, std::vector<float>(values.begin(), values.end()));
}

struct Result {
  int exit_code = -1;
  std::string out, err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "cpuattn_cli_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `a` to <dir>/<name> and returns the path.
  std::string put(const std::string& name, const npy::Array& a) const {
    npy::write(path(name), a);
    return path(name);
  }
  npy::Array get(const std::string& name) const { return npy::read(path(name)); }

  // Runs `cpuattn <args>`; file names in args are relative to the temporary directory.
  Result run(const std::string& args) const {
    const std::string cmd = "cd '" + dir_ + "' && '" CPUATTN_CLI_PATH "' " + args + " >'" +
                            path("stdout.txt") + "' 2>'" + path("stderr.txt") + "'";
    const int status = std::system(cmd.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(path("stdout.txt"));
    r.err = slurp(path("stderr.txt"));
    std::remove(path("stdout.txt").c_str());
    std::remove(path("stderr.txt").c_str());
    return r;
  }

  // Runs `cpuattn <subcommand_> <args>` and expects success; returns OUT (out.npy).
  npy::Array run_ok(const std::string& args) const {
    std::remove(path("out.npy").c_str());
    const Result r = run(subcommand_ + args);
    EXPECT_EQ(r.exit_code, 0) << "cpuattn " << subcommand_ << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err, "");
    if (r.exit_code != 0) return {};
    return get("out.npy");
  }

  // Runs `cpuattn <subcommand_> <args>` (`cpuattn <args>` if `subcommand` is false) and expects
  // exit code 2, exactly one line "cpuattn: ..." on stderr, and no OUT (out.npy). Returns stderr.
  std::string run_bad(const std::string& args, bool subcommand = true) const {
    std::remove(path("out.npy").c_str());
    const Result r = run((subcommand ? subcommand_ : "") + args);
    EXPECT_EQ(r.exit_code, 2) << "cpuattn " << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.rfind("cpuattn: ", 0), 0u) << r.err;
    EXPECT_FALSE(r.err.empty());
    if (!r.err.empty()) {
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "stderr is not one line: " << r.err;
    }
    EXPECT_FALSE(exists(path("out.npy"))) << "OUT was created by a failing run: " << args;
    return r.err;
  }

  std::string dir_;
  std::string subcommand_ = "run ";
};

// Expects `a` to be float32 of `shape` holding `expected` to within rel * |expected| + abs.
inline void expect_values(const npy::Array& a, const Shape& shape,
                          const std::vector<double>& expected, double rel = 1e-6,
                          double abs = 1e-7) {
  ASSERT_EQ(a.dtype, DType::f32);
  ASSERT_EQ(a.shape, shape);
  const std::vector<float> got = npy::values<float>(a);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - expected[i]), rel * std::abs(expected[i]) + abs)
        << "element " << i << ": got " << got[i] << ", expected " << expected[i];
  }
}

}  // namespace cpuattn::cli_test
