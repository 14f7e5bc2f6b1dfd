// npy::parse on arbitrary bytes. It must return an Array or throw npy::Error, nothing else (an
// escaping exception terminates, which libFuzzer reports), never read outside the input (libFuzzer
// hands it a heap copy of exactly `size` bytes, so ASan sees any overrun), and what it returns must
// be consistent and survive serialize() -> parse() unchanged in every format version.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "npy.h"

namespace npy = cpuattn::npy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  npy::Array a;
  try {
    a = npy::parse(data, size);
  } catch (const npy::Error&) {
    return 0;  // rejected: the message's quality is tested by tests/test_npy.cpp
  }
  FUZZ_CHECK(npy::supported(a.dtype), "parsed an unsupported dtype %d", static_cast<int>(a.dtype));
  const auto expected_bytes =
      static_cast<std::uint64_t>(a.numel()) * npy::element_size(a.dtype);  // numel() checks
  FUZZ_CHECK(a.data.size() == expected_bytes, "shape %s needs %llu bytes, data has %zu",
             npy::shape_str(a.shape).c_str(), static_cast<unsigned long long>(expected_bytes),
             a.data.size());
  // The data is the tail of the input: parse() neither adds nor drops bytes.
  FUZZ_CHECK(a.data.size() <= size &&
                 (a.data.empty() ||
                  std::memcmp(a.data.data(), data + size - a.data.size(), a.data.size()) == 0),
             "data is not the last %zu bytes of the input", a.data.size());

  for (int version : {0, 1, 2, 3}) {
    // A parsed Array always fits a version 1.0 header (at most 64 dimensions of 19 digits), so
    // serialize() has no reason to fail: an Error here escapes and is reported.
    const std::vector<unsigned char> bytes = npy::serialize(a, version);
    FUZZ_CHECK(bytes.size() > 8 && bytes[6] == (version == 0 ? 1 : version),
               "serialize(version %d) wrote version byte %d", version,
               bytes.size() > 6 ? bytes[6] : -1);
    FUZZ_CHECK((bytes.size() - a.data.size()) % 64 == 0,
               "serialize(version %d): data starts at %zu, not a multiple of 64", version,
               bytes.size() - a.data.size());
    npy::Array b;
    try {
      b = npy::parse(bytes.data(), bytes.size());
    } catch (const npy::Error& e) {
      FUZZ_CHECK(false, "serialize(version %d) wrote a file parse() rejects: %s", version,
                 e.what());
    }
    FUZZ_CHECK(b.dtype == a.dtype && b.shape == a.shape && b.data == a.data,
               "round trip through version %d changed the array: %s %s -> %s %s", version,
               npy::descr(a.dtype), npy::shape_str(a.shape).c_str(), npy::descr(b.dtype),
               npy::shape_str(b.shape).c_str());
  }
  return 0;
}
