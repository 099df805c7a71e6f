// Paged decode attention on the CPU: one query per sequence over its K/V where they lie in the
// block cache, in one call per layer for every sequence (see kernels/cpu_decode.py for why).
//
// Work is split over (sequence, KV head) pairs on torch's own thread pool (at::parallel_for): each
// pair reads its keys once for the query heads that share them (grouped-query attention), keeps
// the scores, softmaxes them in float, and reads its values once. No gather, no padding.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "cpu_clones.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

inline __attribute__((always_inline)) float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline __attribute__((always_inline)) void axpy(float* __restrict out, const float* __restrict x, float weight, int64_t n) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) out[i] += weight * x[i];
}

struct Shapes {
  int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks;
  int64_t block_stride, token_stride;  // elements between blocks, between tokens of a block
};

// Calls `visit(position, token_offset)` for positions [first, length) in order, walking the
// block table a block at a time (no division per token), the next block prefetched from `base`
// (the cache at this head).
// Asks for the next block's rows of this head while the current one is read: blocks lie anywhere
// in the cache, so the hardware prefetcher, which follows addresses within a page, cannot.
inline __attribute__((always_inline)) void prefetch_block(const float* head_base, const Shapes& s) {
  constexpr int64_t kLine = 64 / sizeof(float);
  for (int64_t token = 0; token < s.block_size; ++token) {
    const float* row = head_base + token * s.token_stride;
    for (int64_t i = 0; i < s.head_dim; i += kLine) __builtin_prefetch(row + i);
  }
}

template <typename Visit>
inline __attribute__((always_inline)) void for_each_token(const float* base, const int32_t* table,
                                                          int64_t first, int64_t length,
                                                          const Shapes& s, Visit&& visit) {
  const int64_t last_block = (length - 1) / s.block_size;
  for (int64_t block = first / s.block_size; block <= last_block; ++block) {
    if (block < last_block) prefetch_block(base + table[block + 1] * s.block_stride, s);
    const int64_t begin = std::max(first, block * s.block_size);
    const int64_t end = std::min(length, (block + 1) * s.block_size);
    int64_t offset = table[block] * s.block_stride + (begin - block * s.block_size) * s.token_stride;
    for (int64_t p = begin; p < end; ++p, offset += s.token_stride) visit(p, offset);
  }
}

// One (sequence, KV head): its `group` query heads over positions [first, length). Each key and
// value is loaded once for the whole group.
PDSERVE_CLONES
void attend_one(const float* q, const float* k, const float* v, const int32_t* table,
                int64_t first, int64_t length, int64_t kv_head, float scale, const Shapes& s,
                float* out, std::vector<float>& scores) {
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t count = length - first;
  const int64_t dim = s.head_dim;
  scores.resize(group * count);
  const int64_t head_offset = kv_head * dim;
  const float* queries = q + kv_head * group * dim;
  float* outputs = out + kv_head * group * dim;
  for_each_token(k + head_offset, table, first, length, s, [&](int64_t p, int64_t offset) {
    const float* key = k + offset + head_offset;
    for (int64_t g = 0; g < group; ++g) {
      scores[g * count + (p - first)] = dot(queries + g * dim, key, dim) * scale;
    }
  });
  for (int64_t g = 0; g < group; ++g) {
    float* row = scores.data() + g * count;
    const float peak = *std::max_element(row, row + count);
    float total = 0.0f;
    for (int64_t i = 0; i < count; ++i) {
      row[i] = std::exp(row[i] - peak);
      total += row[i];
    }
    const float inverse = 1.0f / total;
    for (int64_t i = 0; i < count; ++i) row[i] *= inverse;
  }
  std::fill_n(outputs, group * dim, 0.0f);
  for_each_token(v + head_offset, table, first, length, s, [&](int64_t p, int64_t offset) {
    const float* value = v + offset + head_offset;
    for (int64_t g = 0; g < group; ++g) {
      axpy(outputs + g * dim, value, scores[g * count + (p - first)], dim);
    }
  });
}

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens,
                                     double scale, int64_t sliding_window) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32, "q: float32 only");
  TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32 && v_cache.scalar_type() == torch::kFloat32,
              "k_cache, v_cache: float32 only");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && context_lens.scalar_type() == torch::kInt32,
              "block_tables, context_lens: int32");
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "caches: head_dim contiguous");
  TORCH_CHECK(k_cache.strides() == v_cache.strides(), "caches: same layout");
  TORCH_CHECK(k_cache.stride(1) == k_cache.size(2) * k_cache.size(3) && k_cache.stride(2) == k_cache.size(3),
              "caches: each block's tokens and heads packed");
  const Shapes shapes{q.size(1),           k_cache.size(2),      q.size(2),
                      k_cache.size(1),     block_tables.size(1), k_cache.stride(0),
                      k_cache.stride(1)};
  TORCH_CHECK(shapes.num_heads % shapes.num_kv_heads == 0, "heads: not a multiple of KV heads");
  const int64_t num_seqs = q.size(0);
  auto out = torch::empty_like(q);
  const float* q_data = q.data_ptr<float>();
  const float* k_data = k_cache.data_ptr<float>();
  const float* v_data = v_cache.data_ptr<float>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lengths = context_lens.data_ptr<int32_t>();
  float* out_data = out.data_ptr<float>();
  const int64_t per_seq = shapes.num_heads * shapes.head_dim;
  const float scale_f = static_cast<float>(scale);
  at::parallel_for(0, num_seqs * shapes.num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seq = item / shapes.num_kv_heads;
      const int64_t kv_head = item % shapes.num_kv_heads;
      const int64_t length = lengths[seq];
      const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, length - sliding_window) : 0;
      attend_one(q_data + seq * per_seq, k_data, v_data, tables + seq * shapes.max_blocks, first,
                 length, kv_head, scale_f, shapes, out_data + seq * per_seq, scores);
    }
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "one query per sequence over its paged K/V (float32)");
}
