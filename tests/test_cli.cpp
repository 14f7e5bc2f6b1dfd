// End-to-end tests of `cpuattn run`: the built binary (CPUATTN_CLI_PATH) on .npy files written
// into a temporary directory. Golden values come from the project's seed documents; every golden
// case runs on the fast path and on the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "npy.h"
#include "shapes.h"

namespace npy = cpuattn::npy;
using cpuattn::DType;

namespace {

using cpuattn::cli_test::exists;
using cpuattn::cli_test::expect_values;
using cpuattn::cli_test::make;
using cpuattn::cli_test::Result;
using cpuattn::cli_test::Shape;
using Cli = cpuattn::cli_test::CliTest;
using Matrix = std::vector<std::vector<double>>;

const double kInvSqrt3 = 1.0 / std::sqrt(3.0);
// Every golden case runs on the fast path with each SIMD provider, and on the reference.
const char* const kPaths[] = {"", " --simd xsimd", " --reference"};

// ---- Helpers -------------------------------------------------------------------------------

std::vector<double> flatten(const Matrix& m) {
  std::vector<double> v;
  for (const auto& row : m) v.insert(v.end(), row.begin(), row.end());
  return v;
}

Shape shape_of(const Matrix& m) {
  return {static_cast<std::int64_t>(m.size()), static_cast<std::int64_t>(m.at(0).size())};
}

npy::Array make(const Matrix& m, DType dtype = DType::f32) {
  return make(shape_of(m), flatten(m), dtype);
}

// Stacks 2-d matrices of equal shape into [n, rows, cols] values.
std::vector<double> stack(std::initializer_list<Matrix> ms) {
  std::vector<double> v;
  for (const auto& m : ms) {
    const auto f = flatten(m);
    v.insert(v.end(), f.begin(), f.end());
  }
  return v;
}

Matrix reversed_rows(Matrix m) { return Matrix(m.rbegin(), m.rend()); }

// ---- The seed documents' examples ----------------------------------------------------------

// Causal self-attention.
const Matrix kCausalQ = {{1, 0, 0}, {0, 1, 0}};
const Matrix kCausalK = {{1, 2, 3}, {4, 5, 6}};
const Matrix kCausalV = {{0, 1, 0}, {1, 0, 1}};
const Matrix kCausalOut = {{0, 1, 0}, {0.8496745531, 0.1503254469, 0.8496745531}};
const Matrix kUnmaskedOut = {{0.8496745531, 0.1503254469, 0.8496745531},
                             {0.8496745531, 0.1503254469, 0.8496745531}};

// Self-attention.
const Matrix kSelfQ = {{2, 0, 2}, {2, 0, 0}, {4, 0, 2}, {2, 1, 2}};
const Matrix kSelfK = {{2, 2, 2}, {0, 2, 1}, {2, 4, 3}, {0, 1, 1}};
const Matrix kSelfV = {{1, 1, 0}, {0, 1, 1}, {1, 2, 1}, {0, 0, 0}};
const Matrix kSelfOut = {{0.9852202489, 1.74174051, 0.7565202611},
                         {0.909652645, 1.409652645, 0.5},
                         {0.99851226, 1.7584933413, 0.7599810813},
                         {0.9956038602, 1.9040730856, 0.9084692254}};

// Quiz.
const Matrix kQuizQ = {{0.4685, 0.9785}};
const Matrix kQuizKV = {{0.5539, 0.7239}, {0.4111, 0.3878}, {0.2376, 0.1264}};
const std::vector<double> kQuizWeights = {0.46431725, 0.31255873, 0.22312402};
const std::vector<double> kQuizOut = {0.4386924863, 0.4855324097};

// Dictionary lookup.
const Matrix kDictK = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
const Matrix kDictV = {{2, 3}, {5, 7}, {3, 2}};
const Matrix kDictQ = {{0, 1, 0}};

// ---- Golden cases --------------------------------------------------------------------------

TEST_F(Cli, CausalSelfAttention) {
  put("q.npy", make(kCausalQ));
  put("k.npy", make(kCausalK));
  put("v.npy", make(kCausalV));
  put("bool_mask.npy", npy::from_values<bool>({2, 2}, {true, false, true, true}));
  const double inf = std::numeric_limits<double>::infinity();
  put("add_mask.npy", make({2, 2}, {0, -inf, 0, 0}, DType::f64));
  put("big_mask.npy", make({2, 2}, {0, -1e9, 0, 0}));
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy";
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(qkv + " --mask causal" + p), {2, 3}, flatten(kCausalOut));
    expect_values(run_ok(qkv + p), {2, 3}, flatten(kUnmaskedOut));
    expect_values(run_ok(qkv + " --mask bool_mask.npy" + p), {2, 3}, flatten(kCausalOut));
    expect_values(run_ok(qkv + " --mask add_mask.npy" + p), {2, 3}, flatten(kCausalOut));
    expect_values(run_ok(qkv + " --mask big_mask.npy" + p), {2, 3}, flatten(kCausalOut));
    // Lq == Lk: bottom-right is the same as top-left.
    expect_values(run_ok(qkv + " --mask causal-bottom-right" + p), {2, 3}, flatten(kCausalOut));
    // Explicit default scale.
    expect_values(run_ok(qkv + " --mask causal --scale 0.5773502691896258" + p), {2, 3},
                  flatten(kCausalOut));
  }
}

TEST_F(Cli, CausalSelfAttentionLseAndWeights) {
  put("q.npy", make(kCausalQ));
  put("k.npy", make(kCausalK));
  put("v.npy", make(kCausalV));
  const double s = kInvSqrt3;
  const double lse1 = std::log(std::exp(2 * s) + std::exp(5 * s));
  const double w10 = std::exp(2 * s - lse1), w11 = std::exp(5 * s - lse1);
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok("--q q.npy --k k.npy --v v.npy --out out.npy --mask causal "
                         "--lse lse.npy --weights w.npy" +
                         std::string(p)),
                  {2, 3}, flatten(kCausalOut));
    expect_values(get("lse.npy"), {2}, {s, lse1});
    expect_values(get("w.npy"), {2, 2}, {1, 0, w10, w11});
  }
}

TEST_F(Cli, CausalBottomRightWithFewerQueries) {
  // One query (the second row) against both keys: bottom-right lets it see both keys (as the
  // last token of a KV cache), top-left only the first.
  put("q.npy", make({{0, 1, 0}}));
  put("k.npy", make(kCausalK));
  put("v.npy", make(kCausalV));
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy";
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(qkv + " --mask causal-bottom-right" + p), {1, 3}, kUnmaskedOut[1]);
    expect_values(run_ok(qkv + " --mask causal" + p), {1, 3}, {0, 1, 0});
  }
}

TEST_F(Cli, KeyLengths) {
  put("q.npy", make(kCausalQ));
  put("k.npy", make(kCausalK));
  put("v.npy", make(kCausalV));
  put("len64.npy", npy::from_values<std::int64_t>({1}, {1}));
  put("len32.npy", npy::from_values<std::int32_t>({1}, {2}));
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy";
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(qkv + " --key-lengths len64.npy" + p), {2, 3}, {0, 1, 0, 0, 1, 0});
    expect_values(run_ok(qkv + " --key-lengths len32.npy" + p), {2, 3}, flatten(kUnmaskedOut));
  }
}

TEST_F(Cli, CausalSelfAttentionFloat64Inputs) {
  put("q.npy", make(kCausalQ, DType::f64));
  put("k.npy", make(kCausalK, DType::f64));
  put("v.npy", make(kCausalV, DType::f64));
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(
        run_ok("--q q.npy --k k.npy --v v.npy --out out.npy --mask causal" + std::string(p)),
        {2, 3}, flatten(kCausalOut));
  }
  // Mixed float32/float64 inputs.
  put("k32.npy", make(kCausalK));
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok("--q q.npy --k k32.npy --v v.npy --out out.npy" + std::string(p)), {2, 3},
                  flatten(kUnmaskedOut));
  }
}

TEST_F(Cli, SelfAttention) {
  put("q.npy", make(kSelfQ));
  put("k.npy", make(kSelfK));
  put("v.npy", make(kSelfV));
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok("--q q.npy --k k.npy --v v.npy --out out.npy" + std::string(p)), {4, 3},
                  flatten(kSelfOut));
  }
}

TEST_F(Cli, SelfAttentionRank3) {
  // Batch 0: the example; batch 1: the same keys and values with the queries reversed.
  put("q.npy", make({2, 4, 3}, stack({kSelfQ, reversed_rows(kSelfQ)})));
  put("k.npy", make({2, 4, 3}, stack({kSelfK, kSelfK})));
  put("v.npy", make({2, 4, 3}, stack({kSelfV, kSelfV})));
  const auto expected = stack({kSelfOut, reversed_rows(kSelfOut)});
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(
        run_ok("--q q.npy --k k.npy --v v.npy --out out.npy --lse lse.npy" + std::string(p)),
        {2, 4, 3}, expected);
    EXPECT_EQ(get("lse.npy").shape, (Shape{2, 4}));
  }
}

TEST_F(Cli, SelfAttentionRank4) {
  // [B=2, H=2]: heads (example, reversed queries) in batch 0 and (reversed, example) in batch 1.
  put("q.npy",
      make({2, 2, 4, 3}, stack({kSelfQ, reversed_rows(kSelfQ), reversed_rows(kSelfQ), kSelfQ})));
  put("k.npy", make({2, 2, 4, 3}, stack({kSelfK, kSelfK, kSelfK, kSelfK})));
  put("v.npy", make({2, 2, 4, 3}, stack({kSelfV, kSelfV, kSelfV, kSelfV})));
  // Grouped-query attention: one K/V head shared by both query heads.
  put("k1.npy", make({2, 1, 4, 3}, stack({kSelfK, kSelfK})));
  put("v1.npy", make({2, 1, 4, 3}, stack({kSelfV, kSelfV})));
  const auto expected =
      stack({kSelfOut, reversed_rows(kSelfOut), reversed_rows(kSelfOut), kSelfOut});
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(
        run_ok("--q q.npy --k k.npy --v v.npy --out out.npy --weights w.npy" + std::string(p)),
        {2, 2, 4, 3}, expected);
    EXPECT_EQ(get("w.npy").shape, (Shape{2, 2, 4, 4}));
    expect_values(run_ok("--q q.npy --k k1.npy --v v1.npy --out out.npy" + std::string(p)),
                  {2, 2, 4, 3}, expected);
  }
}

TEST_F(Cli, MasksInEveryRank) {
  const Matrix ones = {{1, 1}, {1, 1}}, causal = {{1, 0}, {1, 1}};
  auto bool_mask = [](const Shape& shape, const std::vector<double>& v) {
    return npy::from_values<bool>(shape, std::vector<bool>(v.begin(), v.end()));
  };
  // Rank 3: batch 0 causal, batch 1 unmasked, through a [B, Lq, Lk] mask.
  put("q3.npy", make({2, 2, 3}, stack({kCausalQ, kCausalQ})));
  put("k3.npy", make({2, 2, 3}, stack({kCausalK, kCausalK})));
  put("v3.npy", make({2, 2, 3}, stack({kCausalV, kCausalV})));
  put("m3.npy", bool_mask({2, 2, 2}, stack({causal, ones})));
  put("m3b.npy", bool_mask({1, 2, 2}, flatten(causal)));  // broadcast over B
  put("m2.npy", bool_mask({2, 2}, flatten(causal)));      // lower rank: broadcast
  put("m1.npy", bool_mask({2}, {1, 0}));                  // [Lk]: only key 0
  // Rank 4 [B=1, H=2]: head 0 causal, head 1 unmasked.
  put("q4.npy", make({1, 2, 2, 3}, stack({kCausalQ, kCausalQ})));
  put("k4.npy", make({1, 2, 2, 3}, stack({kCausalK, kCausalK})));
  put("v4.npy", make({1, 2, 2, 3}, stack({kCausalV, kCausalV})));
  put("m4.npy", bool_mask({1, 2, 2, 2}, stack({causal, ones})));
  put("m4h.npy", bool_mask({2, 2, 2}, stack({causal, ones})));  // [H, Lq, Lk] for rank 4
  const std::string qkv3 = "--q q3.npy --k k3.npy --v v3.npy --out out.npy --mask ";
  const std::string qkv4 = "--q q4.npy --k k4.npy --v v4.npy --out out.npy --mask ";
  const auto causal_then_open = stack({kCausalOut, kUnmaskedOut});
  const auto causal_twice = stack({kCausalOut, kCausalOut});
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(qkv3 + "m3.npy" + p), {2, 2, 3}, causal_then_open);
    expect_values(run_ok(qkv3 + "m3b.npy" + p), {2, 2, 3}, causal_twice);
    expect_values(run_ok(qkv3 + "m2.npy" + p), {2, 2, 3}, causal_twice);
    expect_values(run_ok(qkv3 + "m1.npy" + p), {2, 2, 3}, {0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0});
    expect_values(run_ok(qkv3 + "causal" + p), {2, 2, 3}, causal_twice);
    expect_values(run_ok(qkv4 + "m4.npy" + p), {1, 2, 2, 3}, causal_then_open);
    expect_values(run_ok(qkv4 + "m4h.npy" + p), {1, 2, 2, 3}, causal_then_open);
    expect_values(run_ok(qkv4 + "m2.npy" + p), {1, 2, 2, 3}, causal_twice);
  }
}

TEST_F(Cli, Quiz) {
  put("q.npy", make(kQuizQ));
  put("kv.npy", make(kQuizKV));
  const std::string qkv = "--q q.npy --k kv.npy --v kv.npy --out out.npy";
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(qkv + " --no-scale --weights w.npy" + p), {1, 2}, kQuizOut);
    expect_values(get("w.npy"), {1, 3}, kQuizWeights);
    expect_values(run_ok(qkv + " --scale 1" + p), {1, 2}, kQuizOut);
    expect_values(run_ok(qkv + " --temperature 1" + p), {1, 2}, kQuizOut);
    expect_values(run_ok(qkv + " --temperature 0.01" + p), {1, 2}, {0.5539, 0.7239}, 1e-4);
  }
}

TEST_F(Cli, DictionaryLookup) {
  put("q.npy", make(kDictQ));
  put("k.npy", make(kDictK));
  put("v.npy", make(kDictV));
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy";
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(qkv + " --no-scale" + p), {1, 2}, {3.9402922119, 5.0925259814});
    expect_values(run_ok(qkv + " --temperature 0.01" + p), {1, 2}, {5, 7}, 1e-4);
  }
}

TEST_F(Cli, ThreadsDoNotChangeTheResult) {
  put("q.npy", make({2, 2, 4, 3}, stack({kSelfQ, reversed_rows(kSelfQ), kSelfQ, kSelfQ})));
  put("k.npy", make({2, 2, 4, 3}, stack({kSelfK, kSelfK, kSelfK, kSelfK})));
  put("v.npy", make({2, 2, 4, 3}, stack({kSelfV, kSelfV, kSelfV, kSelfV})));
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy" + std::string(p);
    const npy::Array one = run_ok(qkv + " --threads 1");
    const npy::Array two = run_ok(qkv + " --threads 2");
    const npy::Array def = run_ok(qkv);
    EXPECT_EQ(one.data, two.data);
    EXPECT_EQ(one.data, def.data);
  }
}

// ---- Bad input: exit code 2, one line on stderr, no OUT ------------------------------------

class CliBad : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    put("q.npy", make(kCausalQ));
    put("k.npy", make(kCausalK));
    put("v.npy", make(kCausalV));
  }
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy";
};

TEST_F(CliBad, MissingFile) {
  const std::string err = run_bad("--q nope.npy --k k.npy --v v.npy --out out.npy");
  EXPECT_NE(err.find("nope.npy"), std::string::npos) << err;
}

TEST_F(CliBad, MalformedNpy) {
  std::ofstream(path("bad.npy")) << "\x93NUMPY\x01\x00garbage";
  const std::string err = run_bad("--q q.npy --k bad.npy --v v.npy --out out.npy");
  EXPECT_NE(err.find("bad.npy"), std::string::npos) << err;
  std::ofstream(path("text.npy")) << "1,2,3\n";
  run_bad("--q q.npy --k k.npy --v text.npy --out out.npy");
  // Fortran order, with NumPy's advice.
  std::string h = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
  h.resize(117, ' ');
  h += '\n';
  std::string f = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size()) + '\0' + h +
                  std::string(24, '\0');
  std::ofstream(path("fortran.npy"), std::ios::binary) << f;
  EXPECT_NE(
      run_bad("--q fortran.npy --k k.npy --v v.npy --out out.npy").find("np.ascontiguousarray"),
      std::string::npos);
}

TEST_F(CliBad, MismatchedD) {
  put("k2.npy", make({{1, 2}, {4, 5}}));
  const std::string err = run_bad("--q q.npy --k k2.npy --v v.npy --out out.npy");
  EXPECT_NE(err.find("D"), std::string::npos) << err;
}

TEST_F(CliBad, BadMaskValue) {
  const std::string err = run_bad(qkv + " --mask sideways");
  EXPECT_NE(err.find("sideways"), std::string::npos) << err;
  // A mask that does not broadcast, one of the wrong dtype, one of too high a rank.
  put("m3.npy", npy::from_values<bool>({3}, {true, true, true}));
  run_bad(qkv + " --mask m3.npy");
  put("mi.npy", npy::from_values<std::int32_t>({2, 2}, {1, 0, 1, 1}));
  run_bad(qkv + " --mask mi.npy");
  put("mr.npy", npy::from_values<bool>({1, 2, 2}, {true, false, true, true}));
  run_bad(qkv + " --mask mr.npy");
  put("ms.npy", npy::from_values<bool>({}, {true}));
  run_bad(qkv + " --mask ms.npy");
}

TEST_F(CliBad, NegativeScale) {
  run_bad(qkv + " --scale -1");
  run_bad(qkv + " --scale=-1");
  run_bad(qkv + " --scale 0");
  run_bad(qkv + " --scale inf");
  run_bad(qkv + " --scale nan");
  run_bad(qkv + " --scale abc");
  run_bad(qkv + " --temperature 0");
  run_bad(qkv + " --temperature -2");
}

TEST_F(CliBad, TwoScaleOptions) {
  run_bad(qkv + " --scale 1 --no-scale");
  run_bad(qkv + " --scale 1 --temperature 2");
  run_bad(qkv + " --temperature 2 --no-scale");
}

TEST_F(CliBad, OtherBadInputs) {
  // Ranks differ.
  put("k3.npy", make({1, 2, 3}, flatten(kCausalK)));
  run_bad("--q q.npy --k k3.npy --v v.npy --out out.npy");
  // Rank 1 and rank 5.
  put("r1.npy", make({3}, {1, 2, 3}));
  run_bad("--q r1.npy --k k.npy --v v.npy --out out.npy");
  put("r5.npy", make({1, 1, 1, 2, 3}, flatten(kCausalQ)));
  run_bad("--q r5.npy --k k.npy --v v.npy --out out.npy");
  // Integer Q, empty Q.
  put("qi.npy", npy::from_values<std::int32_t>({2, 3}, {1, 0, 0, 0, 1, 0}));
  run_bad("--q qi.npy --k k.npy --v v.npy --out out.npy");
  put("q0.npy", npy::zeros(DType::f32, {0, 3}));
  run_bad("--q q0.npy --k k.npy --v v.npy --out out.npy");
  // V with a different Lk.
  put("v3.npy", make({{0, 1, 0}, {1, 0, 1}, {1, 1, 1}}));
  run_bad("--q q.npy --k k.npy --v v3.npy --out out.npy");
  // Key lengths: wrong shape, wrong dtype, out of range.
  put("len2.npy", npy::from_values<std::int64_t>({2}, {1, 1}));
  run_bad(qkv + " --key-lengths len2.npy");
  put("lenf.npy", make({1}, {1}));
  run_bad(qkv + " --key-lengths lenf.npy");
  put("len9.npy", npy::from_values<std::int32_t>({1}, {9}));
  run_bad(qkv + " --key-lengths len9.npy");
  // Threads.
  run_bad(qkv + " --threads 0");
  run_bad(qkv + " --threads two");
  // Missing required option, unknown option, no subcommand.
  run_bad("--q q.npy --k k.npy --v v.npy");
  run_bad(qkv + " --frobnicate");
  run_bad("", /*subcommand=*/false);
  run_bad("walk " + qkv, /*subcommand=*/false);
  // Two outputs with the same name.
  run_bad(qkv + " --lse out.npy");
  // OUT in a directory that does not exist: nothing is created anywhere.
  run_bad("--q q.npy --k k.npy --v v.npy --out no/such/dir/out.npy");
  // An auxiliary output that cannot be written: OUT is written last, so it is not created.
  run_bad(qkv + " --lse no/such/dir/lse.npy");
  run_bad(qkv + " --weights no/such/dir/w.npy");
}

TEST_F(CliBad, ExistingOutIsLeftAloneOnFailure) {
  const npy::Array old = make({1}, {42});
  put("keep.npy", old);
  const Result r = run("run --q q.npy --k k.npy --v v.npy --out keep.npy --scale -3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(get("keep.npy").data, old.data);
}

// ---- Help ----------------------------------------------------------------------------------

TEST_F(Cli, Help) {
  const Result top = run("--help");
  EXPECT_EQ(top.exit_code, 0) << top.err;
  EXPECT_NE(top.out.find("run"), std::string::npos) << top.out;

  const Result r = run("run --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* option : {"--q", "--k", "--v", "--out", "--mask", "causal-bottom-right",
                             "--key-lengths", "--scale", "--temperature", "--no-scale", "--lse",
                             "--weights", "--threads", "--simd", "--reference", "Example"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << "run --help lacks " << option;
  }
}

}  // namespace

namespace {

// Every bench record names its provider: --simd measures several in one run, CPUATTN_SIMD sets
// the default.
// --variant times every score variant of a shape in turns and names it in each record; W1's
// FLOPs count the attended pairs of its window only.
TEST_F(Cli, BenchVariantsAndWindowShape) {
  const Result r =
      run("bench --shape 1,2,8,8,16 --threads 1 --repeat 1 --json --variant plain,softcap,all");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* v : {"plain", "softcap", "all"})
    EXPECT_NE(r.out.find(std::string("\"variant\":\"") + v + "\""), std::string::npos) << v;
  EXPECT_NE(r.out.find("+softcap"), std::string::npos) << r.out;
  const Result layer = run("bench --shape M2 --threads 1 --repeat 1 --variant alibi");
  EXPECT_EQ(layer.exit_code, 2) << layer.out;
  EXPECT_NE(layer.err.find("--variant alibi"), std::string::npos) << layer.err;
  const Result bad = run("bench --shape 1,2,8,8,16 --variant rope");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  const cpuattn::bench::Shape w1 = cpuattn::bench::named_shapes().at("W1");
  // 4096 keys per row once the window is full, fewer for the first 4095 rows.
  const double pairs = 4096.0 * 32768 - 4095.0 * 4096 / 2;
  EXPECT_EQ(w1.pairs(), pairs);
  EXPECT_EQ(w1.flops(), 16 * 128 * 2 * pairs);
}

TEST_F(Cli, BenchNamesTheSimdProviderOfEachRecord) {
  const Result both =
      run("bench --shape 1,2,8,8,16 --threads 1 --repeat 1 --json --simd highway,xsimd");
  ASSERT_EQ(both.exit_code, 0) << both.err;
  EXPECT_NE(both.out.find("\"simd\":\"highway\""), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("\"simd\":\"xsimd\""), std::string::npos) << both.out;
  ::setenv("CPUATTN_SIMD", "xsimd", 1);
  const Result env = run("bench --shape 1,2,8,8,16 --threads 1 --repeat 1 --json");
  ::unsetenv("CPUATTN_SIMD");
  ASSERT_EQ(env.exit_code, 0) << env.err;
  EXPECT_NE(env.out.find("\"simd\":\"xsimd\""), std::string::npos) << env.out;
  EXPECT_EQ(env.out.find("\"simd\":\"highway\""), std::string::npos) << env.out;
  const Result bad = run("bench --shape 1,2,8,8,16 --simd neon");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.err.find("--simd"), std::string::npos) << bad.err;
}

}  // namespace

namespace {

// --dtype rounds Q, K and V once and computes from them; float16 files ('<f2') are read as such.
// The fast path is compared with --reference on the same rounded values (bound:
// docs/precision.md, "Accuracy").
TEST_F(Cli, ReducedPrecisionDtypes) {
  const std::int64_t B = 2, L = 9, D = 16;
  std::vector<double> qv, kv, vv;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (std::int64_t i = 0; i < B * L * D; ++i)
    qv.push_back(u(rng)), kv.push_back(u(rng)), vv.push_back(u(rng));
  put("q.npy", make({B, L, D}, qv));
  put("k.npy", make({B, L, D}, kv));
  put("v.npy", make({B, L, D}, vv));
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy --mask causal";
  for (const char* dt : {"bf16", "f16"}) {
    SCOPED_TRACE(dt);
    const npy::Array ref = run_ok(qkv + " --reference --dtype " + dt);
    const auto want = npy::values<float>(ref);
    expect_values(run_ok(qkv + " --dtype " + dt), {B, L, D},
                  std::vector<double>(want.begin(), want.end()), 0, std::ldexp(1.0, -8) + 1e-5);
  }
  // The same values as float16 files: computed as f16 without --dtype, and equal to --dtype f16.
  for (const char* name : {"q", "k", "v"}) {
    npy::Array a = get(std::string(name) + ".npy");
    npy::Array h = npy::zeros(DType::f16, a.shape);
    const auto f = npy::values<float>(a);
    for (std::size_t i = 0; i < f.size(); ++i) {
      const std::uint16_t bits = cpuattn::to_f16(f[i]);
      std::memcpy(h.data.data() + 2 * i, &bits, 2);
    }
    put(std::string(name) + "16.npy", h);
  }
  const auto via_flag = npy::values<float>(run_ok(qkv + " --dtype f16"));
  expect_values(run_ok("--q q16.npy --k k16.npy --v v16.npy --out out.npy --mask causal"),
                {B, L, D}, std::vector<double>(via_flag.begin(), via_flag.end()), 0, 0);
  run_bad(qkv + " --dtype int8");
}

// The variants (--window, --softcap, --alibi, --alibi-slopes, --sinks) on the worked example of
// docs/api.md ("Attention variants"): one query (q = 1, D = 1, --no-scale) against keys 1..5 with
// values 10..50, so the scores are the keys; expected values from the formulas, on every path.
// With --lse.
TEST_F(Cli, Variants) {
  put("q.npy", make({1, 1}, {1}));
  put("k.npy", make({5, 1}, {1, 2, 3, 4, 5}));
  put("v.npy", make({5, 1}, {10, 20, 30, 40, 50}));
  put("slopes.npy", npy::from_values<double>({1}, {0.75}));
  put("sinks.npy", make({1}, {4.5}));
  const double inf = std::numeric_limits<double>::infinity();
  // out and lse of transformed, masked scores s (-inf = masked) and a sink.
  const auto expect = [](const std::vector<double>& s, double sink) {
    double m = sink;
    for (double x : s) m = std::max(m, x);
    double l = std::exp(sink - m), acc = 0;
    for (std::size_t j = 0; j < s.size(); ++j) {
      l += std::exp(s[j] - m);
      acc += std::exp(s[j] - m) * 10.0 * static_cast<double>(j + 1);
    }
    return std::pair{acc / l, m + std::log(l)};
  };
  struct Variant {
    std::string flags;
    std::vector<double> s;
    double sink;
  };
  std::vector<Variant> variants;
  variants.push_back({" --window 2,0", {-inf, -inf, 3, 4, 5}, -inf});
  {
    std::vector<double> capped, alibi, all;
    for (int j = 0; j < 5; ++j) {
      const double x = j + 1.0, c = 2.0 * std::tanh(x / 2.0);
      capped.push_back(c);
      alibi.push_back(x - 0.75 * (4 - j));
      all.push_back(j < 1 ? -inf : c - std::exp2(-8.0) * (4 - j));
    }
    variants.push_back({" --softcap 2", capped, -inf});
    variants.push_back({" --alibi-slopes slopes.npy", alibi, -inf});
    variants.push_back({" --sinks sinks.npy", {1, 2, 3, 4, 5}, 4.5});
    variants.push_back({" --window 3,-1 --softcap 2 --alibi --sinks sinks.npy", all, 4.5});
  }
  const std::string qkv = "--q q.npy --k k.npy --v v.npy --out out.npy --no-scale --lse lse.npy";
  for (const Variant& var : variants) {
    const auto [out, lse] = expect(var.s, var.sink);
    for (const char* p : kPaths) {
      SCOPED_TRACE(var.flags + p);
      expect_values(run_ok(qkv + var.flags + p), {1, 1}, {out}, 2e-6);
      expect_values(get("lse.npy"), {1}, {lse}, 2e-6);
    }
  }
}

TEST_F(CliBad, Variants) {
  put("h2.npy", make({2}, {1, 2}));
  put("nan.npy", make({1}, {std::nan("")}));
  for (const char* flags :
       {" --window 3", " --window a,b", " --window 1,2,3", " --window -2,0", " --softcap 0",
        " --softcap -1", " --softcap inf", " --alibi-slopes h2.npy", " --sinks h2.npy",
        " --sinks nan.npy", " --alibi --alibi-slopes h2.npy", " --sinks missing.npy"}) {
    SCOPED_TRACE(flags);
    run_bad(qkv + flags);
  }
}

// --cu-seqlens-q/-k: a packed batch of three sequences (one without keys) equals the runs of each
// sequence alone, on every path; LSE is [H, total_q]; bad offsets are exit 2 with nothing written.
TEST_F(Cli, PackedVariableLengthBatch) {
  const std::int64_t D = 4;
  const std::vector<std::int64_t> lq{3, 2, 4}, lk{5, 0, 4};
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> q, k, v;
  for (std::int64_t n : lq)
    for (std::int64_t i = 0; i < n * D; ++i) q.push_back(u(rng));
  for (std::int64_t n : lk)
    for (std::int64_t i = 0; i < n * D; ++i) k.push_back(u(rng)), v.push_back(u(rng));
  put("q.npy", make({9, 1, D}, q));
  put("k.npy", make({9, 1, D}, k));
  put("v.npy", make({9, 1, D}, v));
  put("cq.npy", npy::from_values<std::int32_t>({4}, {0, 3, 5, 9}));
  put("ck.npy", npy::from_values<std::int64_t>({4}, {0, 5, 5, 9}));
  const std::string flags = " --mask causal-bottom-right --softcap 2";
  std::vector<double> want;
  std::int64_t oq = 0, ok = 0;
  for (std::size_t b = 0; b < lq.size(); ++b) {
    if (lk[b] == 0) {
      want.insert(want.end(), static_cast<std::size_t>(lq[b] * D), 0.0);
    } else {
      put("sq.npy",
          make({lq[b], D}, std::vector<double>(q.begin() + oq * D, q.begin() + (oq + lq[b]) * D)));
      put("sk.npy",
          make({lk[b], D}, std::vector<double>(k.begin() + ok * D, k.begin() + (ok + lk[b]) * D)));
      put("sv.npy",
          make({lk[b], D}, std::vector<double>(v.begin() + ok * D, v.begin() + (ok + lk[b]) * D)));
      const auto one = npy::values<float>(
          run_ok("--q sq.npy --k sk.npy --v sv.npy --out out.npy --reference" + flags));
      want.insert(want.end(), one.begin(), one.end());
    }
    oq += lq[b], ok += lk[b];
  }
  const std::string packed =
      "--q q.npy --k k.npy --v v.npy --out out.npy --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy" +
      flags;
  for (const char* p : kPaths) {
    SCOPED_TRACE(p);
    expect_values(run_ok(packed + " --lse lse.npy" + p), {9, 1, D}, want, 1e-6, 1e-6);
    const auto lse = npy::values<float>(get("lse.npy"));
    ASSERT_EQ(get("lse.npy").shape, (Shape{1, 9}));
    EXPECT_TRUE(std::isinf(lse[3]) && lse[3] < 0);  // the sequence without keys
  }
  put("bad.npy", npy::from_values<std::int32_t>({4}, {0, 3, 2, 9}));
  run_bad(
      "--q q.npy --k k.npy --v v.npy --out out.npy --cu-seqlens-q bad.npy --cu-seqlens-k "
      "ck.npy");
  run_bad("--q q.npy --k k.npy --v v.npy --out out.npy --cu-seqlens-q cq.npy");
  run_bad(packed + " --weights w.npy");
  EXPECT_FALSE(exists(path("w.npy")));
}

}  // namespace
