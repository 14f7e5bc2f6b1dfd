// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Only what cpuattn's tools need: little-endian float32/float64/int32/int64 and bool arrays in C
// order, of any rank (rank 0 = scalar). Everything else is rejected with a message that says what
// is wrong and, when it can, how to fix it on the NumPy side.
//
// parse() reads an in-memory buffer and is written to be fuzzed: it never reads outside
// [bytes, bytes + size), only allocates what the buffer proves it holds, and throws nothing but
// npy::Error (std::bad_alloc included: it becomes an Error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// Only the header's inline parts (DType, views) are used: cpuattn_npy does not link the library,
// so fuzzers can link it alone.
#include "cpuattn/cpuattn.h"

namespace cpuattn::npy {

// Every failure of this module. The message does not start with "cpuattn: "; read() and write()
// start it with the path.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An owned, C-ordered array. data.size() == element_size(dtype) * product(shape).
struct Array {
  DType dtype = DType::f32;  // f32, f64, boolean, i32 or i64
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> data;

  int rank() const { return static_cast<int>(shape.size()); }
  // Product of the shape (1 for a scalar). Valid for every Array made by this module.
  std::int64_t numel() const;
};

// Whether `dtype` can be stored in a .npy file by this module.
bool supported(DType dtype);
// Bytes per element of a supported dtype (0 for others). Same as cpuattn::dtype_size, without
// needing the library.
std::size_t element_size(DType dtype);
// NumPy's descr string: "<f4", "<f8", "|b1", "<i4", "<i8"; throws Error for other dtypes.
const char* descr(DType dtype);
// "(2, 3)", "(5,)" or "()": the shape as NumPy prints it.
std::string shape_str(const std::vector<std::int64_t>& shape);

// A zero-filled array. Throws Error for an unsupported dtype, a negative dimension or a size
// that overflows.
Array zeros(DType dtype, std::vector<std::int64_t> shape);

// Parses a whole .npy file held in memory.
Array parse(const unsigned char* bytes, std::size_t size);
// Reads and parses the file at `path`: a regular file only (opened without blocking, so a FIFO
// is an error, not a hang), header first, so that the data buffer is sized from the header
// after checking it against the file's size. Error messages start with "<path>: " (path shown
// with files::display).
Array read(const std::string& path);

// The bytes of a .npy file holding `array`. version 0 picks the oldest format that can hold the
// header (1.0 almost always); 1, 2 or 3 force that version. The header is padded so that the data
// starts at a multiple of 64 bytes, as NumPy does. Throws Error for an inconsistent Array.
std::vector<unsigned char> serialize(const Array& array, int version = 0);
// Writes `array` to `path` as files::write_file does (files.h: atomic replacement through a
// temporary in the target's directory, symlinks followed, special files written in place). On
// failure `path` is left as it was and Error is thrown.
void write(const std::string& path, const Array& array);
// The bytes write() would write, with errors naming `path` (to stage several outputs).
std::string as_bytes(const std::string& path, const Array& array);
// The same for any bytes (the heatmap's PNG and SVG).
void write_bytes(const std::string& path, std::string_view bytes);

// ---- Typed helpers -------------------------------------------------------------------------

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::f32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DType::f64;
  } else if constexpr (std::is_same_v<T, bool>) {
    return DType::boolean;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return DType::i32;
  } else {
    static_assert(std::is_same_v<T, std::int64_t>, "npy: unsupported element type");
    return DType::i64;
  }
}

// An array of `shape` holding `values` (row-major). Throws Error if the counts differ.
template <class T>
Array from_values(std::vector<std::int64_t> shape, const std::vector<T>& values) {
  Array a = zeros(dtype_of<T>(), std::move(shape));
  if (static_cast<std::int64_t>(values.size()) != a.numel()) {
    throw Error("from_values: " + std::to_string(values.size()) + " values for shape " +
                shape_str(a.shape));
  }
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < values.size(); ++i) a.data[i] = values[i] ? 1 : 0;
  } else if (!values.empty()) {
    std::memcpy(a.data.data(), values.data(), a.data.size());
  }
  return a;
}

// The elements of `a` as a vector of T. Throws Error unless a.dtype is dtype_of<T>().
template <class T>
std::vector<T> values(const Array& a) {
  if (a.dtype != dtype_of<T>()) {
    throw Error(std::string("array has dtype ") + descr(a.dtype) + ", expected " +
                descr(dtype_of<T>()));
  }
  std::vector<T> out(a.data.size() / sizeof(T));
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = a.data[i] != 0;
  } else if (!out.empty()) {
    std::memcpy(out.data(), a.data.data(), out.size() * sizeof(T));
  }
  return out;
}

// A copy of `a` converted to float32 (from float64 or float32).
// A float64 value beyond float32's range (finite, |x| > 3.4e38) is an Error naming `what` (the
// file), the element and its value; NaN and +-inf convert as they are.
Array to_f32(const Array& a, const std::string& what = "array");

// ---- Views for the library -----------------------------------------------------------------

// Row-major view of `a` with its own rank (0..4), filled directly from the shape.
template <class View, class Bytes>
View view_of(Bytes* data, const Array& a) {
  if (a.rank() > kMaxRank) {
    throw Error("array of shape " + shape_str(a.shape) + " has rank " + std::to_string(a.rank()) +
                "; at most " + std::to_string(kMaxRank) + " is supported");
  }
  View t;
  t.data = data;
  t.dtype = a.dtype;
  t.rank = a.rank();
  std::int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = a.shape[d];
    t.strides[d] = stride;
    stride *= a.shape[d];  // cannot overflow: numel() fits in int64
  }
  return t;
}

inline TensorView input_view(const Array& a) {
  return view_of<TensorView>(static_cast<const void*>(a.data.data()), a);
}
inline OutputView output_view(Array& a) {
  return view_of<OutputView>(static_cast<void*>(a.data.data()), a);
}

}  // namespace cpuattn::npy
