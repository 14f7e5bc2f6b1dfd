// The project's named benchmark shapes (README, "Benchmarks"), shared by `cpuattn bench` and the
// Google Benchmark suite so both measure the same problems.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>

namespace cpuattn::bench {

struct Shape {
  std::string name;
  std::int64_t B, H, Lq, Lk, D, Hkv, Dv;
  bool causal;
  double flops() const {
    const double per_head =
        causal ? double(D + Dv) * 2 * Lq * (Lq + 1) / 2 : double(D + Dv) * 2 * Lq * Lk;
    return B * H * per_head;  // = 4 B H Lq Lk D when Dv = D (causal: L (L + 1) / 2 pairs)
  }
  double kv_bytes() const { return double(B) * Hkv * Lk * (D + Dv) * 4; }
  bool decode() const { return Lq == 1; }
  std::string dims() const {
    std::ostringstream s;
    s << "B" << B << " H" << H;
    if (Hkv != H) s << " Hkv" << Hkv;
    s << " Lq" << Lq << " Lk" << Lk << " D" << D;
    if (Dv != D) s << " Dv" << Dv;
    if (causal) s << " causal";
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
  };
  return shapes;
}

}  // namespace cpuattn::bench
