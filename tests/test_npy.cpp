// Tests of the .npy reader/writer (tools/lib/npy.h): round trips, every header version, one test per
// rejection reason, and robustness against truncated and corrupted input.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "npy.h"

namespace npy = cpuattn::npy;
using cpuattn::DType;

namespace {

using Bytes = std::vector<unsigned char>;

// A .npy file built by hand: magic, version, header length (2 bytes for 1.x, 4 otherwise),
// the header text as given (no padding added), then `data`.
Bytes build(const std::string& header, const Bytes& data = {}, int major = 1, int minor = 0) {
  Bytes b = {0x93,
             'N',
             'U',
             'M',
             'P',
             'Y',
             static_cast<unsigned char>(major),
             static_cast<unsigned char>(minor)};
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  for (std::size_t i = 0; i < len_bytes; ++i) {
    b.push_back(static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff));
  }
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::string dict(const std::string& descr, const std::string& fortran, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }\n";
}

npy::Array parse(const Bytes& b) { return npy::parse(b.data(), b.size()); }

// Expects parse to throw npy::Error whose message contains `needle`.
void expect_error(const Bytes& b, const std::string& needle) {
  try {
    parse(b);
    ADD_FAILURE() << "parse accepted a buffer that should fail with '" << needle << "'";
  } catch (const npy::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// An array of `shape` and `dtype` whose bytes are a simple pattern, so that mix-ups show.
npy::Array pattern(DType dtype, std::vector<std::int64_t> shape) {
  npy::Array a = npy::zeros(dtype, std::move(shape));
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    a.data[i] = dtype == DType::boolean ? static_cast<unsigned char>(i % 3 == 0)
                                        : static_cast<unsigned char>(i * 7 + 1);
  }
  return a;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "npy_test_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Names of the entries in the directory (without . and ..).
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      ::closedir(d);
    }
    return names;
  }

 private:
  std::string path_;
};

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

const DType kDTypes[] = {DType::f32, DType::f64, DType::boolean, DType::i32, DType::i64};
const std::vector<std::int64_t> kShapes[] = {{},           {5}, {2, 3},   {2, 1, 3},
                                             {2, 3, 1, 4}, {0}, {3, 0, 2}};

// ---- Round trips ---------------------------------------------------------------------------

TEST(NpyRoundTrip, EveryDTypeAndRankInMemory) {
  for (DType dtype : kDTypes) {
    for (const auto& shape : kShapes) {
      SCOPED_TRACE(std::string(npy::descr(dtype)) + " " + npy::shape_str(shape));
      const npy::Array a = pattern(dtype, shape);
      const Bytes bytes = npy::serialize(a);
      const npy::Array b = parse(bytes);
      EXPECT_EQ(b.dtype, dtype);
      EXPECT_EQ(b.shape, shape);
      EXPECT_EQ(b.data, a.data);
      EXPECT_EQ(b.rank(), static_cast<int>(shape.size()));
    }
  }
}

TEST(NpyRoundTrip, EveryDTypeAndRankThroughFiles) {
  TempDir dir;
  for (DType dtype : kDTypes) {
    for (const auto& shape : kShapes) {
      SCOPED_TRACE(std::string(npy::descr(dtype)) + " " + npy::shape_str(shape));
      const npy::Array a = pattern(dtype, shape);
      const std::string path = dir.file("a.npy");
      npy::write(path, a);
      const npy::Array b = npy::read(path);
      EXPECT_EQ(b.dtype, dtype);
      EXPECT_EQ(b.shape, shape);
      EXPECT_EQ(b.data, a.data);
    }
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"a.npy"});  // no temporary files left
}

TEST(NpyRoundTrip, TypedValues) {
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -1e30f};
  EXPECT_EQ(npy::values<float>(parse(npy::serialize(npy::from_values({2, 3}, f)))), f);
  const std::vector<double> d = {0.1, -0.2, 1e300};
  EXPECT_EQ(npy::values<double>(parse(npy::serialize(npy::from_values({3}, d)))), d);
  const std::vector<std::int32_t> i32 = {1, -2, 2147483647};
  EXPECT_EQ(npy::values<std::int32_t>(parse(npy::serialize(npy::from_values({3}, i32)))), i32);
  const std::vector<std::int64_t> i64 = {-1, 9223372036854775807LL};
  EXPECT_EQ(npy::values<std::int64_t>(parse(npy::serialize(npy::from_values({2}, i64)))), i64);
  const std::vector<bool> b = {true, false, false, true};
  const npy::Array ab = npy::from_values({2, 2}, b);
  EXPECT_EQ(ab.data, (Bytes{1, 0, 0, 1}));
  EXPECT_EQ(npy::values<bool>(parse(npy::serialize(ab))), b);
  const std::vector<float> scalar = {42.0f};
  const npy::Array s = parse(npy::serialize(npy::from_values({}, scalar)));
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(npy::values<float>(s), scalar);

  EXPECT_THROW(npy::from_values({2, 2}, f), npy::Error);  // 6 values for 4 elements
  EXPECT_THROW(npy::values<double>(ab), npy::Error);      // wrong dtype
}

TEST(NpyRoundTrip, ToF32) {
  const npy::Array d = npy::from_values<double>({3}, {0.5, -1.25, 1e10});
  const npy::Array f = npy::to_f32(d);
  EXPECT_EQ(f.dtype, DType::f32);
  EXPECT_EQ(f.shape, d.shape);
  EXPECT_EQ(npy::values<float>(f), (std::vector<float>{0.5f, -1.25f, 1e10f}));
  EXPECT_THROW(npy::to_f32(npy::zeros(DType::i32, {2})), npy::Error);
}

TEST(NpyRoundTrip, SerializedHeaderLooksLikeNumPys) {
  const Bytes b = npy::serialize(npy::zeros(DType::f32, {2, 3}));
  ASSERT_GE(b.size(), 10u);
  const std::size_t hlen = b[8] | (b[9] << 8);
  EXPECT_EQ(b[6], 1);
  EXPECT_EQ(b[7], 0);
  EXPECT_EQ((10 + hlen) % 64, 0u);  // data aligned to 64 bytes
  const std::string header(b.begin() + 10, b.begin() + 10 + static_cast<long>(hlen));
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u);
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(b.size(), 10 + hlen + 24);
}

TEST(NpyRoundTrip, ReadsNumPyStyleHeaders) {
  // The header NumPy >= 1.24 writes for np.zeros((2, 3), np.float32): padded to 128 bytes,
  // including the spare room it leaves for growing the first axis.
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  h.resize(117, ' ');
  h += '\n';
  const npy::Array a = parse(build(h, Bytes(24, 0)));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  // Other spellings Python's literal syntax allows: any key order, double quotes, no trailing
  // comma, extra whitespace, Python 2 long suffixes.
  const Bytes data(8 * 6, 0);
  const char* variants[] = {
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f8'}",
      "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2, 3)}",
      "  {  'descr' :'<f8' ,'fortran_order':False,'shape':( 2 ,3 , ) , }  \n",
      "{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }\n",
  };
  for (const char* v : variants) {
    SCOPED_TRACE(v);
    const npy::Array b = parse(build(v, data));
    EXPECT_EQ(b.dtype, DType::f64);
    EXPECT_EQ(b.shape, (std::vector<std::int64_t>{2, 3}));
  }
}

TEST(NpyRoundTrip, ScalarsAndEmptyArrays) {
  const npy::Array s = parse(build(dict("<i8", "False", "()"), Bytes(8, 7)));
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.data, Bytes(8, 7));
  const npy::Array e = parse(build(dict("<f4", "False", "(0, 5)")));
  EXPECT_EQ(e.shape, (std::vector<std::int64_t>{0, 5}));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.data.empty());
}

// ---- Header versions -----------------------------------------------------------------------

TEST(NpyVersions, WritesAndReadsVersions1To3) {
  const npy::Array a = pattern(DType::f32, {3, 4});
  for (int version : {1, 2, 3}) {
    SCOPED_TRACE(version);
    const Bytes b = npy::serialize(a, version);
    EXPECT_EQ(b[6], version);
    EXPECT_EQ(b[7], 0);
    const std::size_t preamble = version == 1 ? 10 : 12;
    const std::size_t hlen =
        version == 1
            ? (b[8] | (b[9] << 8))
            : (b[8] | (b[9] << 8) | (b[10] << 16) | (static_cast<std::size_t>(b[11]) << 24));
    EXPECT_EQ((preamble + hlen) % 64, 0u);
    const npy::Array c = parse(b);
    EXPECT_EQ(c.shape, a.shape);
    EXPECT_EQ(c.data, a.data);
  }
}

TEST(NpyVersions, HandBuiltVersion2And3Headers) {
  for (int major : {2, 3}) {
    const npy::Array a =
        parse(build(dict("<i4", "False", "(2,)"), Bytes{1, 0, 0, 0, 2, 0, 0, 0}, major));
    EXPECT_EQ(npy::values<std::int32_t>(a), (std::vector<std::int32_t>{1, 2}));
  }
}

TEST(NpyVersions, AutomaticVersionIs1) {
  EXPECT_EQ(npy::serialize(npy::zeros(DType::f32, {1, 2, 3, 4}))[6], 1);
}

// ---- Rejections, one per reason ------------------------------------------------------------

TEST(NpyReject, BadMagic) {
  expect_error({}, "not a .npy file (the file is empty)");
  expect_error({'h', 'e', 'l', 'l', 'o'}, "bad magic");
  Bytes b = build(dict("<f4", "False", "(1,)"), Bytes(4, 0));
  b[5] = 'Z';
  expect_error(b, "bad magic");
  b = build(dict("<f4", "False", "(1,)"), Bytes(4, 0));
  b[0] = 0x92;
  expect_error(b, "bad magic");
}

TEST(NpyReject, UnsupportedVersion) {
  const std::string h = dict("<f4", "False", "(1,)");
  expect_error(build(h, Bytes(4, 0), 4, 0), "unsupported .npy format version 4.0");
  expect_error(build(h, Bytes(4, 0), 1, 1), "unsupported .npy format version 1.1");
  expect_error(build(h, Bytes(4, 0), 0, 0), "unsupported .npy format version 0.0");
  expect_error(build(h, Bytes(4, 0), 255, 255), "version 255.255");
}

TEST(NpyReject, HeaderLengthPastTheEnd) {
  Bytes b = build(dict("<f4", "False", "(1,)"), Bytes(4, 0));
  b[8] = 0xff;
  b[9] = 0x7f;
  expect_error(b, "runs past the end of the file");
  Bytes v2 = build(dict("<f4", "False", "(1,)"), Bytes(4, 0), 2);
  v2[11] = 0xff;  // 4 GiB header
  expect_error(v2, "runs past the end of the file");
}

TEST(NpyReject, HeaderNotADictLiteral) {
  const char* bad[] = {
      "",
      "\n",
      "['descr', '<f4']",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)",   // no closing brace
      "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",   // missing comma
      "{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}",   // missing colon
      "{descr: '<f4', 'fortran_order': False, 'shape': (1,)}",    // unquoted key
      "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}",   // unterminated string
      "{'descr': '<f4', 'fortran_order': false, 'shape': (1,)}",  // not Python
      "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",  // trailing text
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}}",
      "{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': (1,)}",  // escapes
      "{'descr': '<f4',, 'fortran_order': False, 'shape': (1,)}",
  };
  for (const char* h : bad) {
    SCOPED_TRACE(h);
    expect_error(build(h, Bytes(4, 0)), "not a valid Python dict literal");
  }
}

TEST(NpyReject, WrongKeys) {
  expect_error(build("{'descr': '<f4', 'fortran_order': False}", Bytes(4, 0)),
               "lacks the key 'shape'");
  expect_error(build("{'fortran_order': False, 'shape': (1,)}", Bytes(4, 0)),
               "lacks the key 'descr'");
  expect_error(build("{'descr': '<f4', 'shape': (1,)}", Bytes(4, 0)),
               "lacks the key 'fortran_order'");
  expect_error(
      build("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", Bytes(4, 0)),
      "unexpected key 'x'");
  expect_error(
      build("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'shape': (1,)}", Bytes(4, 0)),
      "duplicate key 'shape'");
  expect_error(build("{}", Bytes(4, 0)), "lacks the key");
}

TEST(NpyReject, UnsupportedDescrIsNamed) {
  expect_error(build(dict("<u2", "False", "(2,)"), Bytes(4, 0)), "unsupported dtype '<u2'");
  expect_error(build(dict("<u4", "False", "(1,)"), Bytes(4, 0)), "unsupported dtype '<u4'");
  expect_error(build(dict("<c8", "False", "(1,)"), Bytes(8, 0)), "unsupported dtype '<c8'");
  expect_error(build(dict("|O", "False", "(1,)"), Bytes(8, 0)), "unsupported dtype '|O'");
  expect_error(build(dict("float32", "False", "(1,)"), Bytes(4, 0)), "unsupported dtype 'float32'");
  expect_error(
      build("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", Bytes(4, 0)),
      "structured dtypes");
}

TEST(NpyReject, BigEndianDescr) {
  expect_error(build(dict(">f4", "False", "(1,)"), Bytes(4, 0)),
               "big-endian dtype '>f4' is not supported; convert with arr.astype('<f4')");
  expect_error(build(dict(">i8", "False", "(1,)"), Bytes(8, 0)), "big-endian dtype '>i8'");
}

TEST(NpyReject, FortranOrder) {
  expect_error(build(dict("<f4", "True", "(2, 2)"), Bytes(16, 0)),
               "Fortran order is not supported; save with np.ascontiguousarray");
}

TEST(NpyReject, MalformedShape) {
  const char* bad[] = {"[2, 3]", "(2, x)", "(3)",    "2",    "(2 3)", "(,)",
                       "(2,,)",  "('2',)", "(2.0,)", "None", "(2, 3"};
  for (const char* s : bad) {
    SCOPED_TRACE(s);
    expect_error(build(dict("<f4", "False", s), Bytes(24, 0)), "not a valid Python dict literal");
  }
}

TEST(NpyReject, NegativeShape) {
  expect_error(build(dict("<f4", "False", "(-1,)"), Bytes(4, 0)), "negative dimension");
  expect_error(build(dict("<f4", "False", "(2, -3)"), Bytes(4, 0)), "negative dimension");
}

TEST(NpyReject, TooManyDimensions) {
  std::string s = "(";
  for (int i = 0; i < 65; ++i) s += "1, ";
  s += ")";
  expect_error(build(dict("<f4", "False", s), Bytes(4, 0)), "more than 64 dimensions");
}

TEST(NpyReject, ShapeProductOverflow) {
  expect_error(build(dict("<f4", "False", "(4294967296, 4294967296)"), Bytes(4, 0)),
               "size product overflows");
  // Fits in int64 as an element count, but not as a byte count.
  expect_error(build(dict("<f8", "False", "(2305843009213693952,)"), Bytes(8, 0)),
               "size product overflows");
  expect_error(build(dict("<f4", "False", "(99999999999999999999,)"), Bytes(4, 0)),
               "too large for 64 bits");
  // A zero dimension does not excuse the others.
  expect_error(build(dict("<f4", "False", "(0, 4294967296, 4294967296)")),
               "size product overflows");
}

TEST(NpyReject, TruncatedData) {
  expect_error(build(dict("<f4", "False", "(2, 3)"), Bytes(23, 0)), "data is truncated");
  expect_error(build(dict("<f8", "False", "()"), Bytes(0, 0)), "data is truncated");
  // A huge shape with a tiny file: rejected without allocating.
  expect_error(build(dict("<f4", "False", "(1000000000000,)"), Bytes(4, 0)), "data is truncated");
}

TEST(NpyReject, TrailingBytes) {
  expect_error(build(dict("<f4", "False", "(2, 3)"), Bytes(25, 0)), "1 trailing bytes");
  expect_error(build(dict("<f4", "False", "(0,)"), Bytes(4, 0)), "4 trailing bytes");
}

// ---- Robustness ----------------------------------------------------------------------------

TEST(NpyRobust, EveryPrefixOfAValidFileThrows) {
  for (int version : {1, 2, 3}) {
    for (DType dtype : kDTypes) {
      const Bytes full = npy::serialize(pattern(dtype, {2, 3}), version);
      ASSERT_NO_THROW(parse(full));
      for (std::size_t n = 0; n < full.size(); ++n) {
        // A copy of exactly n bytes, so that a sanitizer sees any read past the end.
        const Bytes prefix(full.begin(), full.begin() + static_cast<long>(n));
        EXPECT_THROW(npy::parse(prefix.data(), prefix.size()), npy::Error)
            << "version " << version << ", prefix of " << n << " bytes";
      }
    }
  }
}

TEST(NpyRobust, RandomCorruptionsEitherParseOrThrowError) {
  std::mt19937 rng(12345);
  const Bytes base = npy::serialize(pattern(DType::f32, {2, 3}));
  for (int iter = 0; iter < 20000; ++iter) {
    Bytes b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0:
          b[pos] = static_cast<unsigned char>(rng());
          break;
        case 1:
          b[pos] = "0123456789(),:' -{}TF<|>"[rng() % 24];
          break;
        case 2:
          b.erase(b.begin() + static_cast<long>(pos));
          break;
        default:
          b.insert(b.begin() + static_cast<long>(pos), static_cast<unsigned char>(rng()));
      }
      if (b.empty()) b.push_back(0);
    }
    try {
      const npy::Array a = parse(b);
      EXPECT_EQ(static_cast<std::int64_t>(a.data.size()),
                a.numel() * static_cast<std::int64_t>(npy::element_size(a.dtype)));
    } catch (const npy::Error&) {
    }
  }
}

// ---- Files ---------------------------------------------------------------------------------

TEST(NpyFiles, ReadErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.file("missing.npy");
  try {
    npy::read(missing);
    ADD_FAILURE() << "read of a missing file succeeded";
  } catch (const npy::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(missing + ": cannot open", 0), 0u) << e.what();
  }
  const std::string bad = dir.file("bad.npy");
  std::ofstream(bad) << "definitely not numpy";
  try {
    npy::read(bad);
    ADD_FAILURE() << "read of a malformed file succeeded";
  } catch (const npy::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(bad + ": not a .npy file", 0), 0u) << e.what();
  }
  try {
    npy::read(dir.path());
    ADD_FAILURE() << "read of a directory succeeded";
  } catch (const npy::Error& e) {
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
}

TEST(NpyFiles, WriteReplacesAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("x.npy");
  npy::write(path, npy::from_values<float>({2}, {1, 2}));
  npy::write(path, npy::from_values<std::int64_t>({3}, {4, 5, 6}));
  EXPECT_EQ(npy::values<std::int64_t>(npy::read(path)), (std::vector<std::int64_t>{4, 5, 6}));
  EXPECT_EQ(read_bytes(path), npy::serialize(npy::from_values<std::int64_t>({3}, {4, 5, 6})));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"x.npy"});
}

TEST(NpyFiles, WriteFailuresLeaveNothingBehind) {
  TempDir dir;
  const npy::Array a = npy::from_values<float>({2}, {1, 2});
  // Directory does not exist.
  EXPECT_THROW(npy::write(dir.file("no/such/dir/x.npy"), a), npy::Error);
  // The target is a directory: rename fails, the temporary file must be removed.
  ::mkdir(dir.file("sub").c_str(), 0755);
  std::ofstream(dir.file("sub/keep")) << "x";
  EXPECT_THROW(npy::write(dir.file("sub"), a), npy::Error);
  EXPECT_TRUE(exists(dir.file("sub/keep")));
  // Trailing slash: not a file name.
  EXPECT_THROW(npy::write(dir.file("sub/"), a), npy::Error);
  // An inconsistent array is rejected before anything is created.
  npy::Array broken = a;
  broken.data.pop_back();
  EXPECT_THROW(npy::write(dir.file("broken.npy"), broken), npy::Error);
  npy::Array negative = a;
  negative.shape = {-2};
  EXPECT_THROW(npy::write(dir.file("negative.npy"), negative), npy::Error);
  npy::Array bf16 = a;
  bf16.dtype = DType::bf16;
  EXPECT_THROW(npy::write(dir.file("bf16.npy"), bf16), npy::Error);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"sub"});
  // An existing file survives a failed write over it.
  const std::string keep = dir.file("keep.npy");
  npy::write(keep, a);
  const Bytes before = read_bytes(keep);
  EXPECT_THROW(npy::write(keep, broken), npy::Error);
  EXPECT_EQ(read_bytes(keep), before);
}

TEST(NpyFiles, WriteRelativePath) {
  TempDir dir;
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  EXPECT_NO_THROW(npy::write("rel.npy", npy::from_values<float>({1}, {3})));
  EXPECT_EQ(npy::values<float>(npy::read("rel.npy")), std::vector<float>{3});
  ASSERT_EQ(::chdir(cwd), 0);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"rel.npy"});
}

// ---- Views ---------------------------------------------------------------------------------

TEST(NpyViews, ViewsFillShapeAndStrides) {
  npy::Array a = npy::zeros(DType::f32, {2, 3, 4});
  const cpuattn::TensorView t = npy::input_view(a);
  EXPECT_EQ(t.data, a.data.data());
  EXPECT_EQ(t.dtype, DType::f32);
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.shape[0], 2);
  EXPECT_EQ(t.shape[1], 3);
  EXPECT_EQ(t.shape[2], 4);
  EXPECT_EQ(t.strides[0], 12);
  EXPECT_EQ(t.strides[1], 4);
  EXPECT_EQ(t.strides[2], 1);
  const cpuattn::OutputView o = npy::output_view(a);
  EXPECT_EQ(o.data, a.data.data());
  EXPECT_EQ(o.rank, 3);
  const npy::Array s = npy::zeros(DType::boolean, {});
  EXPECT_EQ(npy::input_view(s).rank, 0);
  EXPECT_THROW(npy::input_view(npy::zeros(DType::f32, {1, 1, 1, 1, 1})), npy::Error);
}

}  // namespace
