// The project's named benchmark shapes (docs/api.md, "The `cpuattn` tool"), shared by
// `cpuattn bench` and the Google Benchmark suite so both measure the same problems.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

namespace cpuattn::bench {

struct Shape {
  std::string name;
  std::int64_t B, H, Lq, Lk, D, Hkv, Dv;
  bool causal;  // top-left
  // Sliding window (AttentionOptions::window_left/right); -1 = unbounded.
  std::int64_t window_left = -1, window_right = -1;
  // Query-key pairs attended per head: causal and window limits, as the kernel sees them.
  double pairs() const {
    if (!causal && window_left < 0 && window_right < 0) return double(Lq) * double(Lk);
    double n = 0;
    for (std::int64_t i = 0; i < Lq; ++i) {
      const std::int64_t pos = i + Lk - Lq;
      std::int64_t end = causal ? std::min(Lk, i + 1) : Lk;
      if (window_right >= 0) end = std::min(end, pos + window_right + 1);
      const std::int64_t begin =
          window_left >= 0 ? std::max<std::int64_t>(0, pos - window_left) : 0;
      n += double(std::max<std::int64_t>(0, end - begin));
    }
    return n;
  }
  // 2 (D + Dv) flops per attended pair and head: 4 B H Lq Lk D when dense with Dv = D.
  double flops() const { return double(B) * H * double(D + Dv) * 2 * pairs(); }
  double kv_bytes() const { return double(B) * Hkv * Lk * (D + Dv) * 4; }
  bool decode() const { return Lq == 1; }
  std::string dims() const {
    std::ostringstream s;
    s << "B" << B << " H" << H;
    if (Hkv != H) s << " Hkv" << Hkv;
    s << " Lq" << Lq << " Lk" << Lk << " D" << D;
    if (Dv != D) s << " Dv" << Dv;
    if (causal) s << " causal";
    if (window_left >= 0 || window_right >= 0)
      s << " window " << window_left << "," << window_right;
    return s.str();
  }
};

inline const std::map<std::string, Shape>& named_shapes() {
  static const std::map<std::string, Shape> shapes = {
      {"S1", {"S1", 32, 12, 128, 128, 64, 12, 64, false}},
      {"P1", {"P1", 1, 16, 2048, 2048, 64, 16, 64, false}},
      {"P2", {"P2", 1, 16, 2048, 2048, 128, 16, 128, true}},
      {"X1", {"X1", 8, 8, 64, 1024, 64, 8, 64, false}},
      {"D1", {"D1", 4, 32, 1, 4096, 128, 8, 128, false}},
      {"D2", {"D2", 8, 32, 1, 16384, 128, 8, 128, false}},
      // P1's heads and D over 32768 tokens, causal with a 4096-token sliding window (each query
      // sees itself and the 4095 keys before it): 1/8 of the dense causal work.
      {"W1", {"W1", 1, 16, 32768, 32768, 64, 16, 64, true, 4095, -1}},
  };
  return shapes;
}

}  // namespace cpuattn::bench
