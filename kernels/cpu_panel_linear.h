// Linear on the CPU over weights packed in panels: out = x . W^T + bias, x and out in float32, W
// float32 or int8 with one scale per output channel (see kernels/cpu_panel_linear.py for why a
// kernel of our own).
//
// The weight is packed once at load into panels of 16 output channels, k-major inside a panel
// ([panels, in_features, 16]), so one step of k loads 16 consecutive weights: two vectors of 8
// floats (int8 ones widened in registers). An int8 channel's scale is constant along k, so it is
// applied once to each finished sum, not to each weight. Threads split the panels (each weight is
// read from memory once, in order); each panel is walked for a tile of input rows at a time, the
// first tile streaming it from memory and the next ones finding it in the caches. The walk asks for
// the weights 2 KB ahead, once per cache line (a software prefetch): the hardware's own prefetcher
// alone left the float32 kernel behind oneDNN from 8 rows up; asking once per k step, four times a
// line for int8, cost int8's batch-1 step about 1 ms.
//
// The kernel bodies, in an unnamed namespace: included by cpu_panel_linear.cpp (its Python module)
// and by cpu_decode_step.cpp (a decode step's layers in one call), one translation unit each.

#pragma once

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
constexpr int64_t kPrefetchBytes = 2048;  // how far ahead of the walk weights are asked for
constexpr int kMaxLanes512 = 24;  // AVX-512 tiles: 24 sums + 8 weights in 32 registers

// The vector paths, narrowest first (kernels/cpu_panel_linear.py `VectorPath`).
constexpr int64_t kPortable = 0, kAvx2 = 1, kAvx512 = 2;

// `Weight` is float (no scales) or int8_t (scales).
template <typename Weight>
struct Problem {
  const float* x;
  const Weight* panels;
  const float* scales;  // int8: [panels * 16], zero-padded; float32: null
  const float* bias;    // [out_features] or null
  float* out;
  int64_t rows, in_features, out_features;
};

// Writes one finished tile row: `sums[j]` is output channel `first + j` before its scale.
template <typename Weight>
inline void store_row(const Problem<Weight>& p, int64_t row, int64_t first, const float* sums) {
  const int64_t width = std::min(kPanel, p.out_features - first);
  float* out = p.out + row * p.out_features + first;
  for (int64_t j = 0; j < width; ++j) {
    const float scaled = p.scales != nullptr ? sums[j] * p.scales[first + j] : sums[j];
    out[j] = scaled + (p.bias != nullptr ? p.bias[first + j] : 0.0f);
  }
}

// Any CPU: the same sums in plain loops (hosts without AVX2 and FMA, other architectures).
template <typename Weight>
void one_panel_portable(const Problem<Weight>& p, int64_t panel) {
  const Weight* weights = p.panels + panel * p.in_features * kPanel;
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

// 8 weights as floats in a register: int8 ones widened; float32 ones loaded (a panel row is 64
// bytes, and torch aligns storage to 64).
inline __attribute__((always_inline)) __m256 load8(const int8_t* bytes) {
  const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed));
}
inline __attribute__((always_inline)) __m256 load8(const float* weights) {
  return _mm256_load_ps(weights);
}

// Sums for `Rows` input rows x one panel over all of k, in named registers (GCC keeps an array
// of vectors in memory, storing every sum each step). With one or two rows, `Chains` independent
// sets of sums take alternate k steps, so that no multiply-add waits on the previous one's
// latency: "lane" v holds row v % Rows over the k steps congruent to v / Rows.
#define PDSERVE_LANE(v)                                                          \
  if constexpr ((v) < Rows * Chains) {                                           \
    constexpr int row_of_lane = (v) % Rows, step_of_lane = (v) / Rows;           \
    if constexpr (row_of_lane == 0) {                                            \
      const Weight* at = weights + (k + step_of_lane) * kPanel;                  \
      if (kStepsPerLine == 1 || (k + step_of_lane) % kStepsPerLine == 0) {       \
        _mm_prefetch(reinterpret_cast<const char*>(at) + kPrefetchBytes, _MM_HINT_T0); \
      }                                                                          \
      low = load8(at);                                                           \
      high = load8(at + 8);                                                      \
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

template <typename Weight, int Rows, int Chains>
inline __attribute__((always_inline)) void rows_of_panel(const Problem<Weight>& p, int64_t panel,
                                                         int64_t row) {
  static_assert(Rows * Chains <= kMaxRows, "12 sums at most: 16 registers");
  constexpr int64_t kStepsPerLine = 64 / (kPanel * sizeof(Weight));  // k steps a cache line holds
  const int64_t k_size = p.in_features;
  const float* x = p.x + row * k_size;
  const Weight* weights = p.panels + panel * k_size * kPanel;
  __m256 low0 = _mm256_setzero_ps(), low1 = low0, low2 = low0, low3 = low0, low4 = low0, low5 = low0;
  __m256 high0 = low0, high1 = low0, high2 = low0, high3 = low0, high4 = low0, high5 = low0;
  __m256 low, high;
  int64_t k = 0;
  for (; k + Chains <= k_size; k += Chains) {
    PDSERVE_LANE(0) PDSERVE_LANE(1) PDSERVE_LANE(2) PDSERVE_LANE(3) PDSERVE_LANE(4) PDSERVE_LANE(5)
  }
  for (; k < k_size; ++k) {
    low = load8(weights + k * kPanel);
    high = load8(weights + k * kPanel + 8);
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

template <typename Weight>
void one_panel_avx2(const Problem<Weight>& p, int64_t panel) {
  int64_t row = 0;
  for (; row + kMaxRows <= p.rows; row += kMaxRows) rows_of_panel<Weight, kMaxRows, 1>(p, panel, row);
  switch (p.rows - row) {
    case 5: rows_of_panel<Weight, 5, 1>(p, panel, row); break;
    case 4: rows_of_panel<Weight, 4, 1>(p, panel, row); break;
    case 3: rows_of_panel<Weight, 3, 2>(p, panel, row); break;
    case 2: rows_of_panel<Weight, 2, 2>(p, panel, row); break;
    case 1: rows_of_panel<Weight, 1, 4>(p, panel, row); break;
    default: break;
  }
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")

// 16 weights (one panel row) as floats in one register.
inline __attribute__((always_inline)) __m512 load16(const int8_t* bytes) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(packed));
}
inline __attribute__((always_inline)) __m512 load16(const float* weights) {
  return _mm512_loadu_ps(weights);
}

// The weight register of panel `q`, k step `c` of a tile (at most 8 in use).
template <int I>
inline __attribute__((always_inline)) __m512& weight_register(__m512& w0, __m512& w1, __m512& w2,
                                                              __m512& w3, __m512& w4, __m512& w5,
                                                              __m512& w6, __m512& w7) {
  if constexpr (I == 0) return w0;
  else if constexpr (I == 1) return w1;
  else if constexpr (I == 2) return w2;
  else if constexpr (I == 3) return w3;
  else if constexpr (I == 4) return w4;
  else if constexpr (I == 5) return w5;
  else if constexpr (I == 6) return w6;
  else return w7;
}

// Sums for `Rows` input rows x `Panels` adjacent panels over all of k, in named registers as in
// the AVX2 path, one register per row and panel (16 channels). Two panels share each broadcast
// input: 24 multiply-adds per k step for 2 weight loads and 12 broadcasts at 12 rows (one panel
// alone would load as often as it multiplies). Lane v holds panel v % Panels, row
// (v / Panels) % Rows, over the k steps congruent to v / (Panels * Rows).
#define PDSERVE_LANE512(v)                                                                    \
  if constexpr ((v) < Panels * Rows * Chains) {                                               \
    constexpr int q = (v) % Panels, r = ((v) / Panels) % Rows, c = (v) / (Panels * Rows);     \
    __m512& w = weight_register<q + Panels * c>(w0, w1, w2, w3, w4, w5, w6, w7);              \
    if constexpr (r == 0) {                                                                   \
      const Weight* at = weights + q * panel_stride + (k + c) * kPanel;                       \
      if (kStepsPerLine == 1 || (k + c) % kStepsPerLine == 0) {                               \
        _mm_prefetch(reinterpret_cast<const char*>(at) + kPrefetchBytes, _MM_HINT_T0);        \
      }                                                                                       \
      w = load16(at);                                                                         \
    }                                                                                         \
    acc##v = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k_size + k + c]), w, acc##v);              \
  }
#define PDSERVE_TAIL_LANE512(v)                                                               \
  if constexpr ((v) < Panels * Rows) {                                                        \
    constexpr int q = (v) % Panels, r = (v) / Panels;                                         \
    __m512& w = weight_register<q>(w0, w1, w2, w3, w4, w5, w6, w7);                           \
    if constexpr (r == 0) w = load16(weights + q * panel_stride + k * kPanel);                \
    acc##v = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k_size + k]), w, acc##v);                   \
  }
#define PDSERVE_LANES512(M)                                                                   \
  M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) M(16) \
  M(17) M(18) M(19) M(20) M(21) M(22) M(23)

template <typename Weight, int Panels, int Rows, int Chains>
inline __attribute__((always_inline)) void tile_avx512(const Problem<Weight>& p, int64_t panel,
                                                       int64_t row) {
  static_assert(Panels * Rows * Chains <= kMaxLanes512 && Panels * Chains <= 8,
                "24 sums and 8 weights at most: 32 registers");
  constexpr int64_t kStepsPerLine = 64 / (kPanel * sizeof(Weight));
  const int64_t k_size = p.in_features, panel_stride = k_size * kPanel;
  const float* x = p.x + row * k_size;
  const Weight* weights = p.panels + panel * panel_stride;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0,
         acc5 = acc0, acc6 = acc0, acc7 = acc0, acc8 = acc0, acc9 = acc0, acc10 = acc0,
         acc11 = acc0, acc12 = acc0, acc13 = acc0, acc14 = acc0, acc15 = acc0, acc16 = acc0,
         acc17 = acc0, acc18 = acc0, acc19 = acc0, acc20 = acc0, acc21 = acc0, acc22 = acc0,
         acc23 = acc0;
  __m512 w0, w1, w2, w3, w4, w5, w6, w7;
  int64_t k = 0;
  for (; k + Chains <= k_size; k += Chains) {
    PDSERVE_LANES512(PDSERVE_LANE512)
  }
  for (; k < k_size; ++k) {
    PDSERVE_LANES512(PDSERVE_TAIL_LANE512)
  }
  const __m512 accs[kMaxLanes512] = {acc0,  acc1,  acc2,  acc3,  acc4,  acc5,  acc6,  acc7,
                                     acc8,  acc9,  acc10, acc11, acc12, acc13, acc14, acc15,
                                     acc16, acc17, acc18, acc19, acc20, acc21, acc22, acc23};
  for (int q = 0; q < Panels; ++q) {
    for (int r = 0; r < Rows; ++r) {
      __m512 sum = accs[q + Panels * r];
      for (int c = 1; c < Chains; ++c) sum = _mm512_add_ps(sum, accs[q + Panels * (r + Rows * c)]);
      alignas(64) float sums[kPanel];
      _mm512_store_ps(sums, sum);
      store_row(p, row + r, (panel + q) * kPanel, sums);
    }
  }
}
#undef PDSERVE_LANE512
#undef PDSERVE_TAIL_LANE512
#undef PDSERVE_LANES512

// Two adjacent panels (`panel`, `panel + 1`), tiles of 12 rows; fewer rows take more chains.
template <typename Weight>
void two_panels_avx512(const Problem<Weight>& p, int64_t panel) {
  int64_t row = 0;
  for (; row + 12 <= p.rows; row += 12) tile_avx512<Weight, 2, 12, 1>(p, panel, row);
  switch (p.rows - row) {
    case 11: tile_avx512<Weight, 2, 11, 1>(p, panel, row); break;
    case 10: tile_avx512<Weight, 2, 10, 1>(p, panel, row); break;
    case 9: tile_avx512<Weight, 2, 9, 1>(p, panel, row); break;
    case 8: tile_avx512<Weight, 2, 8, 1>(p, panel, row); break;
    case 7: tile_avx512<Weight, 2, 7, 1>(p, panel, row); break;
    case 6: tile_avx512<Weight, 2, 6, 1>(p, panel, row); break;
    case 5: tile_avx512<Weight, 2, 5, 1>(p, panel, row); break;
    case 4: tile_avx512<Weight, 2, 4, 1>(p, panel, row); break;
    case 3: tile_avx512<Weight, 2, 3, 2>(p, panel, row); break;
    case 2: tile_avx512<Weight, 2, 2, 2>(p, panel, row); break;
    case 1: tile_avx512<Weight, 2, 1, 4>(p, panel, row); break;
    default: break;
  }
}

#pragma GCC pop_options

bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
#else
template <typename Weight>
void one_panel_avx2(const Problem<Weight>& p, int64_t panel) { one_panel_portable(p, panel); }
template <typename Weight>
void two_panels_avx512(const Problem<Weight>& p, int64_t panel) {
  one_panel_portable(p, panel);
  one_panel_portable(p, panel + 1);
}
bool has_avx2_fma() { return false; }
bool has_avx512() { return false; }
#endif

// The widest vector path this CPU runs (a `VectorPath`).
int64_t widest_path_here() {
  static const int64_t widest = has_avx512() && has_avx2_fma() ? kAvx512 : has_avx2_fma() ? kAvx2 : kPortable;
  return widest;
}

// The path `panel_linear` takes unless told: the widest, but AVX2 on AMD CPUs. AVX-512 paid on an
// Intel host (two 512-bit FMA units: 1.04x AVX2 at one row, 1.8x at prefill chunks); AMD's Zen 4
// splits 512-bit instructions over 256-bit units, and its figures were measured on AVX2
// (docs/kernels.md).
int64_t default_path_here() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool amd = __builtin_cpu_is("amd");
#else
  static const bool amd = false;
#endif
  return amd ? std::min(widest_path_here(), kAvx2) : widest_path_here();
}

template <typename Weight>
void run_panels(const Problem<Weight>& problem, int64_t num_panels, int64_t path) {
  if (path == kAvx512) {  // threads split pairs of panels; an odd last one runs alone on AVX2
    at::parallel_for(0, (num_panels + 1) / 2, 1, [&](int64_t begin, int64_t end) {
      for (int64_t pair = begin; pair < end; ++pair) {
        if (2 * pair + 1 < num_panels) {
          two_panels_avx512(problem, 2 * pair);
        } else {
          one_panel_avx2(problem, 2 * pair);
        }
      }
    });
    return;
  }
  at::parallel_for(0, num_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel) {
      if (path == kAvx2) {
        one_panel_avx2(problem, panel);
      } else {
        one_panel_portable(problem, panel);
      }
    }
  });
}

// out [rows, out_features] = x [rows, in_features] . W^T + bias, W in `panels` (float32, or int8
// with `scales`; checked by the caller), dense rows, on `path` (one this CPU runs).
void linear_into(const float* x, int64_t rows, const torch::Tensor& panels, const float* scales,
                 const float* bias, int64_t out_features, float* out, int64_t path) {
  const int64_t in_features = panels.size(1);
  if (panels.scalar_type() == torch::kInt8) {
    const Problem<int8_t> problem{x, panels.data_ptr<int8_t>(), scales, bias, out,
                                  rows, in_features, out_features};
    run_panels(problem, panels.size(0), path);
  } else {
    const Problem<float> problem{x, panels.data_ptr<float>(), nullptr, bias, out,
                                 rows, in_features, out_features};
    run_panels(problem, panels.size(0), path);
  }
}

// `scales` for int8 panels, none for float32 ones. `path` is the widest vector path to run (the
// tests and `bench linear` run each one this CPU has; a wider one than it has runs the widest).
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor panels, std::optional<torch::Tensor> scales,
                           std::optional<torch::Tensor> bias, int64_t out_features, int64_t path) {
  TORCH_CHECK(x.device().is_cpu() && panels.device().is_cpu(), "x, panels: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() >= 1, "x: float32 only");
  const bool int8 = panels.scalar_type() == torch::kInt8;
  TORCH_CHECK((int8 || panels.scalar_type() == torch::kFloat32) && panels.dim() == 3 &&
                  panels.size(2) == kPanel && panels.is_contiguous(),
              "panels: contiguous int8 or float32 [panels, in_features, 16]");
  const int64_t in_features = panels.size(1);
  TORCH_CHECK(x.size(-1) == in_features, "x: last dimension must be in_features");
  TORCH_CHECK(int8 == scales.has_value(), "scales: needed for int8 panels, none for float32");
  if (scales) TORCH_CHECK(scales->scalar_type() == torch::kFloat32 && scales->is_contiguous() &&
                              scales->numel() == panels.size(0) * kPanel,
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
  const float* bias_data = bias ? bias_tensor.data_ptr<float>() : nullptr;
  TORCH_CHECK(path >= kPortable && path <= kAvx512, "path: 0 (portable), 1 (AVX2), 2 (AVX-512)");
  linear_into(flat.data_ptr<float>(), flat.size(0), panels, scales ? scales->data_ptr<float>() : nullptr,
              bias_data, out_features, out.data_ptr<float>(), std::min(path, widest_path_here()));
  return out.view(out_shape);
}

}  // namespace
