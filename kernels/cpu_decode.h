// Paged decode attention on the CPU: one query per sequence over its K/V where they lie in the
// block cache, in one call per layer for every sequence (see kernels/cpu_decode.py for why).
//
// Work is split over pieces of (sequence, KV head) pairs, up to 256 positions each, on torch's own
// thread pool (at::parallel_for): each piece reads its keys once for the query heads that share
// them (grouped-query attention), keeps the scores, softmaxes them in float against its own peak,
// and reads its values once; the pieces of a pair are then merged. No gather, no padding.
//
// The kernel bodies, in an unnamed namespace: included by cpu_decode.cpp (its Python module)
// and by cpu_decode_step.cpp (a decode step's layers in one call), one translation unit each.

#pragma once

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

// Positions a piece of one (sequence, KV head) covers at most. A long context is split into
// pieces so that both threads have work at one sequence (the split of flash-decoding); each piece
// softmaxes its own scores against its own peak, and the pieces are merged after.
constexpr int64_t kPieceTokens = 256;

struct Piece {
  int64_t seq, kv_head, first, last;  // positions [first, last)
};

// What a piece leaves for the merge, per query head g of its group: sums[g] = sum over its
// positions of exp(score - peaks[g]) * value, totals[g] = sum of exp(score - peaks[g]).
struct Partial {
  float* sums;  // [group, dim]
  float* peaks;  // [group]
  float* totals;  // [group]
};

// One piece: its `group` query heads over its positions. Each key and value is loaded once for
// the whole group.
PDSERVE_CLONES
void attend_piece(const float* q, const float* k, const float* v, const int32_t* table,
                  const Piece& piece, float scale, const Shapes& s, const Partial& partial,
                  std::vector<float>& scores) {
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t count = piece.last - piece.first;
  const int64_t dim = s.head_dim;
  scores.resize(group * count);
  const int64_t head_offset = piece.kv_head * dim;
  const float* queries = q + piece.kv_head * group * dim;
  for_each_token(k + head_offset, table, piece.first, piece.last, s, [&](int64_t p, int64_t offset) {
    const float* key = k + offset + head_offset;
    for (int64_t g = 0; g < group; ++g) {
      scores[g * count + (p - piece.first)] = dot(queries + g * dim, key, dim) * scale;
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
    partial.peaks[g] = peak;
    partial.totals[g] = total;
  }
  std::fill_n(partial.sums, group * dim, 0.0f);
  for_each_token(v + head_offset, table, piece.first, piece.last, s, [&](int64_t p, int64_t offset) {
    const float* value = v + offset + head_offset;
    for (int64_t g = 0; g < group; ++g) {
      axpy(partial.sums + g * dim, value, scores[g * count + (p - piece.first)], dim);
    }
  });
}

// The pieces [begin, end) of one (sequence, KV head) into its `group` output rows: each piece's
// sums and totals rescaled from its peak to the largest.
void merge(const std::vector<float>& sums, const std::vector<float>& peaks,
           const std::vector<float>& totals, int64_t begin, int64_t end, int64_t group,
           int64_t dim, float* out) {
  for (int64_t g = 0; g < group; ++g) {
    float peak = -std::numeric_limits<float>::infinity();
    for (int64_t piece = begin; piece < end; ++piece) peak = std::max(peak, peaks[piece * group + g]);
    float total = 0.0f;
    float* row = out + g * dim;
    std::fill_n(row, dim, 0.0f);
    for (int64_t piece = begin; piece < end; ++piece) {
      const float weight = std::exp(peaks[piece * group + g] - peak);
      total += weight * totals[piece * group + g];
      axpy(row, sums.data() + (piece * group + g) * dim, weight, dim);
    }
    const float inverse = 1.0f / total;
    for (int64_t i = 0; i < dim; ++i) row[i] *= inverse;
  }
}

// The pieces of a step's (sequence, KV head) pairs in that order; `starts[i]` is the first
// piece of pair i (and `starts` ends with the count). They depend on the lengths and the window,
// not on the layer: a step plans them once for all its layers.
struct DecodePieces {
  std::vector<Piece> pieces;
  std::vector<int64_t> starts;
};

DecodePieces plan_pieces(const int32_t* lengths, int64_t num_seqs, int64_t num_kv_heads,
                         int64_t sliding_window) {
  DecodePieces plan;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t length = lengths[seq];
    const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, length - sliding_window) : 0;
    for (int64_t kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
      plan.starts.push_back(static_cast<int64_t>(plan.pieces.size()));
      for (int64_t begin = first; begin < length; begin += kPieceTokens) {
        plan.pieces.push_back({seq, kv_head, begin, std::min(length, begin + kPieceTokens)});
      }
    }
  }
  plan.starts.push_back(static_cast<int64_t>(plan.pieces.size()));
  return plan;
}

// Each sequence's query heads (`q`: [num_seqs, num_heads, head_dim], packed) over its planned
// pieces into `out` (the same shape): the pieces on torch's threads, then each pair's merge.
void run_pieces(const float* q_data, const float* k_data, const float* v_data,
                const int32_t* tables, const Shapes& shapes, const DecodePieces& plan,
                int64_t num_seqs, float scale, float* out_data) {
  const int64_t group = shapes.num_heads / shapes.num_kv_heads;
  const int64_t dim = shapes.head_dim;
  const int64_t num_pieces = static_cast<int64_t>(plan.pieces.size());
  std::vector<float> sums(num_pieces * group * dim), peaks(num_pieces * group), totals(num_pieces * group);
  const int64_t per_seq = shapes.num_heads * dim;
  at::parallel_for(0, num_pieces, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t index = begin; index < end; ++index) {
      const Piece& piece = plan.pieces[index];
      const Partial partial{sums.data() + index * group * dim, peaks.data() + index * group,
                            totals.data() + index * group};
      attend_piece(q_data + piece.seq * per_seq, k_data, v_data,
                   tables + piece.seq * shapes.max_blocks, piece, scale, shapes, partial, scores);
    }
  });
  const int64_t num_pairs = num_seqs * shapes.num_kv_heads;
  at::parallel_for(0, num_pairs, 16, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t seq = pair / shapes.num_kv_heads, kv_head = pair % shapes.num_kv_heads;
      merge(sums, peaks, totals, plan.starts[pair], plan.starts[pair + 1], group, dim,
            out_data + seq * per_seq + kv_head * group * dim);
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
  const DecodePieces plan =
      plan_pieces(context_lens.data_ptr<int32_t>(), num_seqs, shapes.num_kv_heads, sliding_window);
  auto out = torch::empty_like(q);
  run_pieces(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
             block_tables.data_ptr<int32_t>(), shapes, plan, num_seqs, static_cast<float>(scale),
             out.data_ptr<float>());
  return out;
}

}  // namespace
