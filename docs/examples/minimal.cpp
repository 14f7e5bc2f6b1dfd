// Linking cpuattn into a program: causal self-attention on a [B, L, H, D] projection output.
#include <cpuattn/cpuattn.h>

#include <cstdio>
#include <vector>

int main() {
  const std::int64_t B = 2, L = 128, H = 8, D = 64;
  std::vector<float> q(B * L * H * D, 0.01f), k(q.size(), 0.02f), v(q.size(), 0.5f);
  std::vector<float> out(q.size());
  // Views give the logical [B, H, L, D] shape; strides walk the [B, L, H, D] memory.
  auto view = [&](const std::vector<float>& t) {
    return cpuattn::TensorView::blhd(t.data(), cpuattn::DType::f32, B, L, H, D);
  };
  cpuattn::AttentionOptions opts;
  opts.causal = cpuattn::Causal::top_left;
  cpuattn::Context ctx(2);  // two threads; Context() runs on the caller's oneTBB arena
  cpuattn::attention(view(q), view(k), view(v),
                     cpuattn::OutputView::blhd(out.data(), cpuattn::DType::f32, B, L, H, D), opts,
                     &ctx);
  std::printf("out[0] = %.3f on %s\n", out[0], cpuattn::target_name(cpuattn::active_target(&ctx)));
  return out[0] == 0.5f ? 0 : 1;
}
