// Weight-only int8 linear on the CPU: out = x . (q * scales)^T + bias, x and out in float32 (see
// kernels/cpu_int8_linear.py for why a kernel of our own).
//
// The weight is packed once at load into panels of 16 output channels, k-major inside a panel
// ([panels, in_features, 16] int8), so one step of k loads 16 consecutive bytes: two vectors of 8
// weights, widened to float in registers. The per-channel scale is constant along k, so it is
// applied once to each finished sum, not to each weight. Threads split the panels (each weight is
// read from memory once); each panel is walked for a tile of input rows at a time, its 16 x k
// bytes staying in L1 while the tiles pass.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t kPanel = 16;  // output channels a panel holds: two vectors of 8 floats
constexpr int64_t kMaxRows = 6;  // input rows a tile holds: 12 sums + 2 weights + 1 input in 16 registers

struct Problem {
  const float* x;
  const int8_t* panels;
  const float* scales;  // [panels * 16], zero-padded
  const float* bias;    // [out_features] or null
  float* out;
  int64_t rows, in_features, out_features;
};

// Writes one finished tile row: `sums[j]` is output channel `first + j` before its scale.
inline void store_row(const Problem& p, int64_t row, int64_t first, const float* sums) {
  const int64_t width = std::min(kPanel, p.out_features - first);
  float* out = p.out + row * p.out_features + first;
  for (int64_t j = 0; j < width; ++j) {
    out[j] = sums[j] * p.scales[first + j] + (p.bias != nullptr ? p.bias[first + j] : 0.0f);
  }
}

// Any CPU: the same sums in plain loops (hosts without AVX2 and FMA, other architectures).
void one_panel_portable(const Problem& p, int64_t panel) {
  const int8_t* weights = p.panels + panel * p.in_features * kPanel;
  for (int64_t row = 0; row < p.rows; ++row) {
    const float* x = p.x + row * p.in_features;
    float sums[kPanel] = {};
    for (int64_t k = 0; k < p.in_features; ++k) {
      for (int64_t j = 0; j < kPanel; ++j) sums[j] += x[k] * static_cast<float>(weights[k * kPanel + j]);
    }
    store_row(p, row, panel * kPanel, sums);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")

// 8 int8 weights widened to float in a register.
inline __attribute__((always_inline)) __m256 widen(const int8_t* bytes) {
  const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed));
}

// Sums for `Rows` input rows x one panel over all of k, in named registers (GCC keeps an array
// of vectors in memory, storing every sum each step). With one or two rows, `Chains` independent
// sets of sums take alternate k steps, so that no multiply-add waits on the previous one's
// latency: "lane" v holds row v % Rows over the k steps congruent to v / Rows.
#define PDSERVE_LANE(v)                                                          \
  if constexpr ((v) < Rows * Chains) {                                           \
    constexpr int row_of_lane = (v) % Rows, step_of_lane = (v) / Rows;           \
    if constexpr (row_of_lane == 0) {                                            \
      low = widen(weights + (k + step_of_lane) * kPanel);                        \
      high = widen(weights + (k + step_of_lane) * kPanel + 8);                   \
    }                                                                            \
    const __m256 in = _mm256_broadcast_ss(x + row_of_lane * k_size + k + step_of_lane); \
    low##v = _mm256_fmadd_ps(in, low, low##v);                                   \
    high##v = _mm256_fmadd_ps(in, high, high##v);                                \
  }
#define PDSERVE_TAIL_LANE(v)                                          \
  if constexpr ((v) < Rows) {                                         \
    const __m256 in = _mm256_broadcast_ss(x + (v) * k_size + k);      \
    low##v = _mm256_fmadd_ps(in, low, low##v);                        \
    high##v = _mm256_fmadd_ps(in, high, high##v);                     \
  }

template <int Rows, int Chains>
inline __attribute__((always_inline)) void rows_of_panel(const Problem& p, int64_t panel, int64_t row) {
  static_assert(Rows * Chains <= kMaxRows, "12 sums at most: 16 registers");
  const int64_t k_size = p.in_features;
  const float* x = p.x + row * k_size;
  const int8_t* weights = p.panels + panel * k_size * kPanel;
  __m256 low0 = _mm256_setzero_ps(), low1 = low0, low2 = low0, low3 = low0, low4 = low0, low5 = low0;
  __m256 high0 = low0, high1 = low0, high2 = low0, high3 = low0, high4 = low0, high5 = low0;
  __m256 low, high;
  int64_t k = 0;
  for (; k + Chains <= k_size; k += Chains) {
    PDSERVE_LANE(0) PDSERVE_LANE(1) PDSERVE_LANE(2) PDSERVE_LANE(3) PDSERVE_LANE(4) PDSERVE_LANE(5)
  }
  for (; k < k_size; ++k) {
    low = widen(weights + k * kPanel);
    high = widen(weights + k * kPanel + 8);
    PDSERVE_TAIL_LANE(0) PDSERVE_TAIL_LANE(1) PDSERVE_TAIL_LANE(2) PDSERVE_TAIL_LANE(3)
    PDSERVE_TAIL_LANE(4) PDSERVE_TAIL_LANE(5)
  }
  const __m256 lows[kMaxRows] = {low0, low1, low2, low3, low4, low5};
  const __m256 highs[kMaxRows] = {high0, high1, high2, high3, high4, high5};
  for (int r = 0; r < Rows; ++r) {
    __m256 sum_low = lows[r], sum_high = highs[r];
    for (int c = 1; c < Chains; ++c) {
      sum_low = _mm256_add_ps(sum_low, lows[c * Rows + r]);
      sum_high = _mm256_add_ps(sum_high, highs[c * Rows + r]);
    }
    alignas(32) float sums[kPanel];
    _mm256_store_ps(sums, sum_low);
    _mm256_store_ps(sums + 8, sum_high);
    store_row(p, row + r, panel * kPanel, sums);
  }
}
#undef PDSERVE_LANE
#undef PDSERVE_TAIL_LANE

void one_panel_avx2(const Problem& p, int64_t panel) {
  int64_t row = 0;
  for (; row + kMaxRows <= p.rows; row += kMaxRows) rows_of_panel<kMaxRows, 1>(p, panel, row);
  switch (p.rows - row) {
    case 5: rows_of_panel<5, 1>(p, panel, row); break;
    case 4: rows_of_panel<4, 1>(p, panel, row); break;
    case 3: rows_of_panel<3, 2>(p, panel, row); break;
    case 2: rows_of_panel<2, 2>(p, panel, row); break;
    case 1: rows_of_panel<1, 4>(p, panel, row); break;
    default: break;
  }
}

#pragma GCC pop_options

bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
void one_panel_avx2(const Problem& p, int64_t panel) { one_panel_portable(p, panel); }
bool has_avx2_fma() { return false; }
#endif

// `vectorized` false runs the portable loop even where AVX2 and FMA exist (the tests check both).
torch::Tensor int8_linear(torch::Tensor x, torch::Tensor panels, torch::Tensor scales,
                          std::optional<torch::Tensor> bias, int64_t out_features, bool vectorized) {
  TORCH_CHECK(x.device().is_cpu() && panels.device().is_cpu(), "x, panels: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() >= 1, "x: float32 only");
  TORCH_CHECK(panels.scalar_type() == torch::kInt8 && panels.dim() == 3 && panels.size(2) == kPanel &&
                  panels.is_contiguous(),
              "panels: contiguous int8 [panels, in_features, 16]");
  const int64_t in_features = panels.size(1);
  TORCH_CHECK(x.size(-1) == in_features, "x: last dimension must be in_features");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() &&
                  scales.numel() == panels.size(0) * kPanel,
              "scales: float32, one per packed channel");
  TORCH_CHECK(out_features > (panels.size(0) - 1) * kPanel && out_features <= panels.size(0) * kPanel,
              "out_features: does not match the panels");
  if (bias) TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->numel() == out_features,
                        "bias: float32 [out_features]");
  auto flat = x.reshape({-1, in_features}).contiguous();
  auto out_shape = x.sizes().vec();
  out_shape.back() = out_features;
  auto out = torch::empty({flat.size(0), out_features}, x.options());
  const torch::Tensor bias_tensor = bias ? bias->contiguous() : torch::Tensor();
  const Problem problem{flat.data_ptr<float>(),    panels.data_ptr<int8_t>(),
                        scales.data_ptr<float>(),  bias ? bias_tensor.data_ptr<float>() : nullptr,
                        out.data_ptr<float>(),     flat.size(0), in_features, out_features};
  static const bool host_has_avx2_fma = has_avx2_fma();
  vectorized = vectorized && host_has_avx2_fma;
  at::parallel_for(0, panels.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel) {
      if (vectorized) {
        one_panel_avx2(problem, panel);
      } else {
        one_panel_portable(problem, panel);
      }
    }
  });
  return out.view(out_shape);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "x . (int8 panels * scales)^T + bias, float32 x",
        pybind11::arg("x"), pybind11::arg("panels"), pybind11::arg("scales"), pybind11::arg("bias"),
        pybind11::arg("out_features"), pybind11::arg("vectorized") = true);
}
