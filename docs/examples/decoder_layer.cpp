// A Llama-style attention layer: grouped-query heads, Llama 3.1's rotary embedding, bf16 weights
// and a bf16 KV cache. Prefills a prompt, decodes four tokens one at a time, and checks the
// decoded rows against one causal forward pass over the same tokens.
#include <cpuattn/layers.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace cpuattn;

int main() {
  const std::int64_t d = 512, H = 8, Hkv = 2, D = 64, prompt = 16, steps = 4, T = prompt + steps;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<std::vector<std::uint16_t>> w;  // bf16 bits, as checkpoints store them (moving
                                              // the outer vector keeps each buffer in place)
  auto weight = [&](std::int64_t rows, std::int64_t cols) {
    w.emplace_back(rows * cols);
    for (auto& x : w.back()) x = to_bf16(normal(rng));
    return TensorView::contiguous(w.back().data(), DType::bf16, {rows, cols});
  };
  MhaConfig config{.d_model = d, .heads = H, .kv_heads = Hkv, .head_dim = D};
  config.rope = llama31_rope();  // theta 500000, llama3 scaling (factor 8 over 8192)
  const MultiHeadAttention layer(config, {.wq = weight(d, H * D),
                                          .wk = weight(d, Hkv * D),
                                          .wv = weight(d, Hkv * D),
                                          .wo = weight(H * D, d)});
  KvCache cache = layer.make_cache(/*batch=*/1, /*capacity=*/64, /*growable=*/true, DType::bf16);

  std::vector<float> x(T * d), out(T * d), full(T * d);
  for (float& v : x) v = 20 * normal(rng);
  auto rows = [&](std::vector<float>& t, std::int64_t from, std::int64_t n) {
    return OutputView::contiguous(t.data() + from * d, DType::f32, {1, n, d});
  };
  layer.decode(rows(x, 0, prompt), cache, rows(out, 0, prompt));  // prefill, causal
  for (std::int64_t t = prompt; t < T; ++t) layer.decode(rows(x, t, 1), cache, rows(out, t, 1));

  AttentionOptions causal;
  causal.causal = Causal::top_left;
  layer.forward(rows(x, 0, T), rows(full, 0, T), causal);
  float worst = 0, scale = 0;
  for (std::int64_t i = 0; i < T * d; ++i) {
    worst = std::max(worst, std::abs(out[i] - full[i]));
    scale = std::max(scale, std::abs(full[i]));
  }
  std::printf("%lld cached tokens; decode vs forward: max |diff| %.2e of max |out| %.2e\n",
              static_cast<long long>(cache.length()), worst, scale);
  return worst <= 1e-2f * scale ? 0 : 1;  // the bf16 cache rounds K and V to 8 bits
}
