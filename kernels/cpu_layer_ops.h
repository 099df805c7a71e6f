// A decoder layer's small ops on the CPU, each in one call where torch takes several (see
// kernels/layer_ops.py for why): the residual add with RMSNorm, rotary embedding in place, and
// SiLU(gate) * up. float32 only. Rows are split over torch's threads when there are enough of
// them to pay for waking the threads (prefill); a decode step's few rows run on the caller's.
//
// The kernel bodies, in an unnamed namespace: included by cpu_layer_ops.cpp (its Python module)
// and by cpu_decode_step.cpp (a decode step's layers in one call), one translation unit each.

#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "cpu_clones.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

namespace {


// Floats a thread should have at least before the rows are split: ~64 KB of work a thread.
constexpr int64_t kGrainElements = 16384;

int64_t grain_rows(int64_t row_elements) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, row_elements));
}

// residual[i] += hidden[i] (when `add`), then out[i] = residual[i] * rsqrt(mean(residual^2) + eps)
// * weight[i]: transformers' LlamaRMSNorm on the sum, in float32.
PDSERVE_CLONES
void add_rms_norm_row(const float* __restrict hidden, float* __restrict residual,
                      const float* __restrict weight, float* __restrict out, int64_t width,
                      float eps, bool add) {
  float squares = 0.0f;
  if (add) {
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < width; ++i) {
      const float sum = residual[i] + hidden[i];
      residual[i] = sum;
      squares += sum * sum;
    }
  } else {
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < width; ++i) squares += residual[i] * residual[i];
  }
  const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) out[i] = residual[i] * inverse * weight[i];
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, ": float32 on the CPU");
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, ": [rows, width] with contiguous rows");
}

// `residual` None: the first layer, whose residual is `hidden` itself. Otherwise `residual` +=
// `hidden` in place. Returns (the normalized rows, the residual).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor hidden,
                                                      std::optional<torch::Tensor> residual,
                                                      torch::Tensor weight, double eps) {
  check_rows(hidden, "hidden");
  const bool add = residual.has_value();
  torch::Tensor sum = add ? *residual : hidden;
  check_rows(sum, "residual");
  TORCH_CHECK(sum.sizes() == hidden.sizes(), "residual: must have hidden's shape");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == torch::kFloat32 &&
                  weight.numel() == hidden.size(1),
              "weight: float32 [width]");
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  auto out = torch::empty({rows, width}, hidden.options());
  const float* hidden_data = hidden.data_ptr<float>();
  float* sum_data = sum.data_ptr<float>();
  const float* weight_data = weight.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t hidden_stride = hidden.stride(0), sum_stride = sum.stride(0);
  at::parallel_for(0, rows, grain_rows(width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      add_rms_norm_row(hidden_data + row * hidden_stride, sum_data + row * sum_stride, weight_data,
                       out_data + row * width, width, static_cast<float>(eps), add);
    }
  });
  return {out, sum};
}

// One head of one token: x[i] = x[i] cos[i] - x[i + half] sin[i], x[i + half] = x[i + half]
// cos[i + half] + x[i] sin[i + half] (transformers' rotate_half convention).
PDSERVE_CLONES
void rotate_head(float* __restrict x, const float* __restrict cos, const float* __restrict sin,
                 int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float first = x[i], second = x[i + half];
    x[i] = first * cos[i] - second * sin[i];
    x[i + half] = second * cos[i + half] + first * sin[i + half];
  }
}

// x: [tokens, heads, dim] (rows may be strided, heads and dims packed); cos, sin: [tokens, dim].
void rotary_in_place(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 3,
              "x: float32 [tokens, heads, dim] on the CPU");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), "x: each token's heads packed");
  TORCH_CHECK(x.size(2) % 2 == 0, "x: head dim must be even");
  for (const auto* table : {&cos, &sin}) {
    TORCH_CHECK(table->scalar_type() == torch::kFloat32 && table->is_contiguous() &&
                    table->dim() == 2 && table->size(0) == x.size(0) && table->size(1) == x.size(2),
                "cos, sin: contiguous float32 [tokens, dim]");
  }
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2);
  float* data = x.data_ptr<float>();
  const float* cos_data = cos.data_ptr<float>();
  const float* sin_data = sin.data_ptr<float>();
  const int64_t token_stride = x.stride(0);
  at::parallel_for(0, tokens, grain_rows(heads * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        rotate_head(data + t * token_stride + h * dim, cos_data + t * dim, sin_data + t * dim,
                    dim / 2);
      }
    }
  });
}

PDSERVE_CLONES
void silu_and_mul_row(const float* __restrict gate, const float* __restrict up,
                      float* __restrict out, int64_t width) {
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// gate_up: [rows, 2 * width], gate then up; returns SiLU(gate) * up, [rows, width].
torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up: width must be even");
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  auto out = torch::empty({rows, width}, gate_up.options());
  const float* in_data = gate_up.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t stride = gate_up.stride(0);
  at::parallel_for(0, rows, grain_rows(width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* gate = in_data + row * stride;
      silu_and_mul_row(gate, gate + width, out_data + row * width, width);
    }
  });
  return out;
}

}  // namespace
