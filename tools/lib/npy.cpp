// NumPy .npy reader/writer. Format reference:
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//
//   "\x93NUMPY" major minor  header_len (u16 LE for 1.0; u32 LE for 2.0 and 3.0)
//   header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//           padded with spaces and ending in '\n' (latin-1 for 1.0/2.0, utf-8 for 3.0)
//   data:   product(shape) elements, C order
#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string_view>

#include "files.h"

namespace cpuattn::npy {

static_assert(std::endian::native == std::endian::little,
              "npy.cpp stores data as read; it assumes a little-endian host");

namespace {

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kMagicLen = sizeof(kMagic);
constexpr std::size_t kMaxDims = 64;  // NumPy 2's NPY_MAXDIMS
constexpr std::size_t kAlign = 64;    // NumPy aligns the data to 64 bytes
// read() refuses longer headers (NumPy's own limit is 10000 bytes unless told otherwise).
constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

// `s` quoted for a message: printable ASCII kept, anything else as \xNN, long input cut short.
std::string quoted(std::string_view s, std::size_t max_len = 40) {
  std::string out = "'";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == max_len) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + "'";
}

std::string supported_list() {
  return "'<f4' (float32), '<f8' (float64), '<f2' (float16), '|b1' (bool), '<i4' (int32), "
         "'<i8' (int64)";
}

// Product of the dimensions, each counted as at least 1 (so that every stride of a C-order view
// fits in int64 even when some dimension is 0), times `element_size`. nullopt on overflow.
std::optional<std::int64_t> checked_bytes(const std::vector<std::int64_t>& shape,
                                          std::size_t element_size) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, d < 1 ? 1 : d, &n)) return std::nullopt;
  }
  if (__builtin_mul_overflow(n, static_cast<std::int64_t>(element_size), &n)) return std::nullopt;
  return n;
}

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;  // callers have checked checked_bytes() first
  return n;
}

// ---- The header dict ------------------------------------------------------------------------

struct Header {
  std::optional<std::string_view> descr;
  bool descr_is_list = false;  // a structured dtype
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::int64_t>> shape;
};

// Parses the subset of Python literal syntax NumPy writes: a dict with string keys whose values
// are strings, True/False or tuples of non-negative integers. Anything else is an Error.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  Header parse() {
    Header h;
    skip_ws();
    if (!take('{')) malformed("it does not start with '{'");
    for (;;) {
      skip_ws();
      if (take('}')) break;
      const std::string_view key = parse_key();
      skip_ws();
      if (!take(':')) malformed("expected ':' after key " + quoted(key));
      skip_ws();
      if (key == "descr") {
        if (h.descr || h.descr_is_list) malformed("duplicate key 'descr'");
        if (peek() == '[') {
          h.descr_is_list = true;
          skip_bracketed();
        } else {
          h.descr = parse_string("the value of 'descr'");
        }
      } else if (key == "fortran_order") {
        if (h.fortran_order) malformed("duplicate key 'fortran_order'");
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (h.shape) malformed("duplicate key 'shape'");
        h.shape = parse_shape();
      } else {
        fail("header has unexpected key " + quoted(key) +
             "; a .npy header has exactly the keys 'descr', 'fortran_order' and 'shape'");
      }
      skip_ws();
      if (take(',')) continue;
      skip_ws();
      if (take('}')) break;
      malformed("expected ',' or '}' after the value of " + quoted(key));
    }
    skip_ws();
    if (pos_ != s_.size()) malformed("unexpected text after the closing '}'");
    for (const char* key : {"descr", "fortran_order", "shape"}) {
      const bool present = key[0] == 'd'   ? (h.descr || h.descr_is_list)
                           : key[0] == 'f' ? h.fortran_order.has_value()
                                           : h.shape.has_value();
      if (!present) {
        fail(std::string("header lacks the key '") + key +
             "'; a .npy header has exactly the keys 'descr', 'fortran_order' and 'shape'");
      }
    }
    return h;
  }

 private:
  [[noreturn]] void malformed(const std::string& why) const {
    fail("header is not a valid Python dict literal (" + why + " at offset " +
         std::to_string(pos_) + "): " + quoted(s_, 80));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  bool take(char c) {
    if (at_end() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                         s_[pos_] == '\r' || s_[pos_] == '\f' || s_[pos_] == '\v')) {
      ++pos_;
    }
  }

  std::string_view parse_key() {
    if (peek() != '\'' && peek() != '"') malformed("expected a quoted key or '}'");
    return parse_string("a key");
  }

  // A plain '...' or "..." literal; escapes never occur in a valid header and are rejected.
  std::string_view parse_string(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') malformed(std::string("expected a string for ") + what);
    const std::size_t start = ++pos_;
    while (!at_end() && s_[pos_] != q) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n') malformed("unsupported string literal");
      ++pos_;
    }
    if (at_end()) malformed("unterminated string");
    return s_.substr(start, pos_++ - start);
  }

  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    malformed("'fortran_order' must be True or False");
  }

  // Skips a [...] value (a structured descr), so that the error can say what it was.
  void skip_bracketed() {
    int depth = 0;
    while (!at_end()) {
      const char c = s_[pos_++];
      if (c == '[' || c == '(') ++depth;
      if ((c == ']' || c == ')') && --depth == 0) return;
    }
    malformed("unterminated list");
  }

  std::int64_t parse_dim() {
    if (peek() == '-') fail("shape has a negative dimension: " + quoted(s_, 80));
    if (peek() < '0' || peek() > '9') malformed("'shape' must be a tuple of integers");
    std::int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v)) {
        fail("shape has a dimension too large for 64 bits: " + quoted(s_, 80));
      }
      ++pos_;
    }
    if (peek() == 'L' || peek() == 'l') ++pos_;  // Python 2 long, in files written by Python 2
    return v;
  }

  std::vector<std::int64_t> parse_shape() {
    if (peek() != '(') malformed("'shape' must be a tuple such as (2, 3), (5,) or ()");
    ++pos_;
    std::vector<std::int64_t> dims;
    bool comma_after_last = false;
    for (;;) {
      skip_ws();
      if (take(')')) break;
      if (!dims.empty() && !comma_after_last) malformed("expected ',' or ')' in 'shape'");
      if (dims.size() == kMaxDims) {
        fail("shape has more than " + std::to_string(kMaxDims) + " dimensions");
      }
      dims.push_back(parse_dim());
      skip_ws();
      comma_after_last = take(',');
    }
    // Python reads "(3)" as the integer 3, not a tuple.
    if (dims.size() == 1 && !comma_after_last) {
      malformed("'shape' (n) is an integer, not a tuple; a 1-d shape is written (n,)");
    }
    return dims;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

DType dtype_from_descr(std::string_view d) {
  if (d == "<f4") return DType::f32;
  if (d == "<f8") return DType::f64;
  if (d == "<f2") return DType::f16;
  if (d == "|b1") return DType::boolean;
  if (d == "<i4") return DType::i32;
  if (d == "<i8") return DType::i64;
  if (!d.empty() && d[0] == '>') {
    std::string little(d);
    little[0] = '<';
    fail("big-endian dtype " + quoted(d) + " is not supported; convert with arr.astype(" +
         quoted(little) + ")");
  }
  fail("unsupported dtype " + quoted(d) + "; supported: " + supported_list());
}

std::uint32_t read_le(const unsigned char* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// What the preamble and header say: the array without its data, where the data starts and how
// many bytes it needs. Needs the bytes up to the end of the header only.
struct Prefix {
  Array array;
  std::size_t data_start = 0;
  std::size_t nbytes = 0;
};

// Bytes of preamble before the header text, once the version is known (at most 12).
constexpr std::size_t kMaxPreamble = kMagicLen + 2 + 4;

Prefix parse_prefix(const unsigned char* bytes, std::size_t size) {
  if (bytes == nullptr && size != 0) fail("null buffer");
  if (size == 0) fail("not a .npy file (the file is empty)");
  // Magic: compare what is there, so that a short non-npy input is "bad magic", not "truncated".
  for (std::size_t i = 0; i < kMagicLen && i < size; ++i) {
    if (bytes[i] != kMagic[i]) {
      fail("not a .npy file (bad magic: the file must start with \"\\x93NUMPY\")");
    }
  }
  if (size < kMagicLen + 2) fail("truncated: the file ends inside the .npy preamble");
  const int major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
         " (supported: 1.0, 2.0, 3.0)");
  }
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t header_start = kMagicLen + 2 + len_bytes;
  if (size < header_start) fail("truncated: the file ends inside the .npy preamble");
  const std::size_t header_len = read_le(bytes + kMagicLen + 2, static_cast<int>(len_bytes));
  if (header_len > size - header_start) {
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
         std::to_string(size) + " bytes)");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes + header_start), header_len);
  const Header h = HeaderParser(text).parse();

  if (h.descr_is_list) fail("structured dtypes (a list 'descr') are not supported");
  Prefix p;
  Array& a = p.array;
  a.dtype = dtype_from_descr(*h.descr);
  if (*h.fortran_order) {
    fail("Fortran order is not supported; save with np.ascontiguousarray");
  }
  a.shape = *h.shape;
  const std::size_t esize = element_size(a.dtype);
  if (!checked_bytes(a.shape, esize)) {
    fail("shape " + shape_str(a.shape) + " of " + descr(a.dtype) + ": size product overflows");
  }
  const auto numel = static_cast<std::uint64_t>(product(a.shape));
  if (numel > std::numeric_limits<std::size_t>::max() / esize) {
    fail("shape " + shape_str(a.shape) + " of " + descr(a.dtype) + ": size product overflows");
  }
  p.data_start = header_start + header_len;
  p.nbytes = static_cast<std::size_t>(numel) * esize;
  return p;
}

// The file holds `available` bytes after the header: exactly what the header demands, or Error.
void check_data_size(const Prefix& p, std::size_t available) {
  const Array& a = p.array;
  const std::size_t esize = element_size(a.dtype);
  if (p.nbytes > available) {
    fail("data is truncated: shape " + shape_str(a.shape) + " of " + descr(a.dtype) + " needs " +
         std::to_string(p.nbytes / esize) + " elements of " + std::to_string(esize) +
         " bytes, the file has " + std::to_string(available) + " bytes of data");
  }
  if (available != p.nbytes) {
    fail("data has " + std::to_string(available - p.nbytes) + " trailing bytes: shape " +
         shape_str(a.shape) + " of " + descr(a.dtype) + " needs " + std::to_string(p.nbytes) +
         " bytes, the file has " + std::to_string(available));
  }
}

Array parse_impl(const unsigned char* bytes, std::size_t size) {
  Prefix p = parse_prefix(bytes, size);
  check_data_size(p, size - p.data_start);
  const unsigned char* data = bytes + p.data_start;
  p.array.data.assign(data, data + p.nbytes);
  return std::move(p.array);
}

}  // namespace

// ---- Public functions -------------------------------------------------------------------------

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      throw Error("invalid shape " + shape_str(shape));
    }
  }
  return n;
}

bool supported(DType dtype) { return element_size(dtype) != 0; }

std::size_t element_size(DType dtype) {
  // The dtypes a .npy file can carry here; cpuattn's others (bf16, f16) have no numpy descr.
  switch (dtype) {
    case DType::f32:
    case DType::f64:
    case DType::f16:
    case DType::boolean:
    case DType::i32:
    case DType::i64:
      return cpuattn::dtype_size(dtype);
    default:
      return 0;
  }
}

const char* descr(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::f16:
      return "<f2";
    case DType::boolean:
      return "|b1";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    default:
      throw Error("dtype " + std::to_string(static_cast<int>(dtype)) +
                  " cannot be stored in a .npy file by cpuattn");
  }
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Array zeros(DType dtype, std::vector<std::int64_t> shape) {
  const std::size_t esize = element_size(dtype);
  if (esize == 0) descr(dtype);  // throws
  if (shape.size() > kMaxDims) fail("shape has more than " + std::to_string(kMaxDims) + " dims");
  if (!checked_bytes(shape, esize)) {
    fail("invalid shape " + shape_str(shape) + " (negative dimension or size overflow)");
  }
  Array a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  try {
    a.data.assign(static_cast<std::size_t>(product(a.shape)) * esize, 0);
  } catch (const std::bad_alloc&) {
    fail("out of memory allocating an array of shape " + shape_str(a.shape));
  } catch (const std::length_error&) {
    fail("out of memory allocating an array of shape " + shape_str(a.shape));
  }
  return a;
}

Array to_f32(const Array& a, const std::string& what) {
  if (a.dtype == DType::f32) return a;
  if (a.dtype == DType::f16) {
    Array out = zeros(DType::f32, a.shape);
    const std::size_t n = out.data.size() / sizeof(float);
    if (a.data.size() != n * 2) fail("array data does not match its shape");
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, a.data.data() + i * 2, 2);
      const float f = from_f16(h);
      std::memcpy(out.data.data() + i * sizeof(float), &f, sizeof f);
    }
    return out;
  }
  if (a.dtype != DType::f64) {
    fail(std::string("cannot convert dtype ") + descr(a.dtype) + " to float32");
  }
  Array out = zeros(DType::f32, a.shape);
  const std::size_t n = out.data.size() / sizeof(float);
  if (a.data.size() != n * sizeof(double)) fail("array data does not match its shape");
  for (std::size_t i = 0; i < n; ++i) {
    double d;
    std::memcpy(&d, a.data.data() + i * sizeof(double), sizeof d);
    if (std::isfinite(d) && std::abs(d) > std::numeric_limits<float>::max()) {
      std::string at;
      for (std::size_t r = a.shape.size(), rest = i; r-- > 0;) {
        const auto n = static_cast<std::size_t>(a.shape[r]);
        at = std::to_string(rest % n) + (at.empty() ? "" : "," + at);
        rest /= n;
      }
      char value[32];
      std::snprintf(value, sizeof value, "%.9g", d);
      fail(what + ": element [" + at + "] = " + value +
           " is beyond float32's range (+-3.40282347e+38)");
    }
    const auto f = static_cast<float>(d);
    std::memcpy(out.data.data() + i * sizeof(float), &f, sizeof f);
  }
  return out;
}

Array parse(const unsigned char* bytes, std::size_t size) {
  try {
    return parse_impl(bytes, size);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail("out of memory while parsing");
  } catch (const std::exception& e) {
    fail(std::string("internal error while parsing: ") + e.what());
  }
}

Array read(const std::string& path) {
  const std::string shown = files::display(path);
  try {
    const auto [fd, size] = files::open_input(path);
    try {
      // The preamble and header first, then the data buffer sized from the header: a sparse
      // 3 GB file with a tiny header must fail on its size, not allocate 3 GB first.
      std::vector<unsigned char> head(std::min(size, kMaxPreamble));
      files::read_exact(fd, head.data(), head.size(), path);
      std::size_t header_end = head.size();
      if (head.size() >= kMagicLen + 2 && std::equal(kMagic, kMagic + kMagicLen, head.begin()) &&
          head[6] >= 1 && head[6] <= 3) {
        const std::size_t len_bytes = head[6] == 1 ? 2 : 4;
        if (head.size() >= kMagicLen + 2 + len_bytes) {
          const std::size_t header_len =
              read_le(head.data() + kMagicLen + 2, static_cast<int>(len_bytes));
          header_end = std::min(size, kMagicLen + 2 + len_bytes + header_len);
        }
      }
      if (header_end > kMaxHeaderBytes) {
        fail("header of " + std::to_string(header_end) + " bytes is too long (at most " +
             std::to_string(kMaxHeaderBytes) + ")");
      }
      const std::size_t have = head.size();
      if (header_end > have) {
        head.resize(header_end);
        files::read_exact(fd, head.data() + have, header_end - have, path);
      }
      Prefix p = parse_prefix(head.data(), head.size());
      check_data_size(p, size - p.data_start);
      p.array.data.resize(p.nbytes);
      if (::lseek(fd, static_cast<off_t>(p.data_start), SEEK_SET) < 0) {
        fail(std::string("cannot seek: ") + std::strerror(errno));
      }
      files::read_exact(fd, p.array.data.data(), p.nbytes, path);
      ::close(fd);
      return std::move(p.array);
    } catch (...) {
      ::close(fd);
      throw;
    }
  } catch (const files::Error& e) {
    throw Error(e.what());  // already names the path
  } catch (const Error& e) {
    throw Error(shown + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw Error(shown + ": out of memory reading the file");
  } catch (const std::exception& e) {
    throw Error(shown + ": " + e.what());
  }
}

std::vector<unsigned char> serialize(const Array& a, int version) {
  const std::size_t esize = element_size(a.dtype);
  const char* d = descr(a.dtype);  // throws for unsupported dtypes
  if (a.shape.size() > kMaxDims) fail("shape has more than " + std::to_string(kMaxDims) + " dims");
  if (!checked_bytes(a.shape, esize)) {
    fail("invalid shape " + shape_str(a.shape) + " (negative dimension or size overflow)");
  }
  const auto nbytes = static_cast<std::uint64_t>(product(a.shape)) * esize;
  if (nbytes != a.data.size()) {
    fail("array of shape " + shape_str(a.shape) + " and dtype " + d + " needs " +
         std::to_string(nbytes) + " bytes of data, has " + std::to_string(a.data.size()));
  }
  if (version < 0 || version > 3) fail("unsupported .npy version " + std::to_string(version));

  std::string header = std::string("{'descr': '") + d +
                       "', 'fortran_order': False, 'shape': " + shape_str(a.shape) + ", }";
  auto padded_len = [&](std::size_t len_bytes) {
    const std::size_t unpadded = kMagicLen + 2 + len_bytes + header.size() + 1;  // + '\n'
    return header.size() + 1 + (kAlign - unpadded % kAlign) % kAlign;
  };
  if (version == 0) version = padded_len(2) <= 0xffff ? 1 : 2;
  const std::size_t len_bytes = version == 1 ? 2 : 4;
  const std::size_t hlen = padded_len(len_bytes);
  if (hlen > (version == 1 ? 0xffffu : 0xffffffffu)) {
    fail("header too long for .npy version " + std::to_string(version));
  }
  header.resize(hlen - 1, ' ');
  header += '\n';

  // Sized once and filled with memcpy: GCC 12 reports vector::insert into reserved capacity as a
  // stringop-overflow (a false positive) at -O3.
  std::vector<unsigned char> out(kMagicLen + 2 + len_bytes + hlen + a.data.size());
  unsigned char* p = out.data();
  std::memcpy(p, kMagic, kMagicLen);
  p += kMagicLen;
  *p++ = static_cast<unsigned char>(version);
  *p++ = 0;
  for (std::size_t i = 0; i < len_bytes; ++i)
    *p++ = static_cast<unsigned char>((hlen >> (8 * i)) & 0xff);
  std::memcpy(p, header.data(), header.size());
  p += header.size();
  if (!a.data.empty()) std::memcpy(p, a.data.data(), a.data.size());
  return out;
}

void write(const std::string& path, const Array& array) {
  write_bytes(path, as_bytes(path, array));
}

std::string as_bytes(const std::string& path, const Array& array) {
  try {
    const std::vector<unsigned char> bytes = serialize(array);
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  } catch (const Error& e) {
    throw Error(files::display(path) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw Error(files::display(path) + ": out of memory");
  }
}

void write_bytes(const std::string& path, std::string_view bytes) {
  try {
    files::write_file(path, bytes);
  } catch (const files::Error& e) {
    throw Error(e.what());
  }
}

}  // namespace cpuattn::npy
