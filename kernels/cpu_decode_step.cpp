// A decode-only step's decoder layers in one call (see kernels/decode_step.py for why): the
// kernels of the per-op modules, from their headers, in the order core/model/forward.py calls
// them and on the same inputs, so the output is theirs bit for bit. What goes is everything between
// them: about 35 torch ops, 45 Python frames and 8 temporaries a layer.

#include "cpu_decode.h"
#include "cpu_layer_ops.h"
#include "cpu_panel_linear.h"

#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

namespace {

// A linear layer as kernels/cpu_panel_linear.py packed it.
struct PanelWeight {
  torch::Tensor panels;  // float32 or int8 [panels, in_features, 16]
  std::optional<torch::Tensor> scales;  // int8: one per packed channel
  std::optional<torch::Tensor> bias;  // [out_features]
  int64_t out_features;

  const float* scales_data() const { return scales ? scales->data_ptr<float>() : nullptr; }
  const float* bias_data() const { return bias ? bias->data_ptr<float>() : nullptr; }
  int64_t in_features() const { return panels.size(1); }
};

using PanelTuple = std::tuple<torch::Tensor, std::optional<torch::Tensor>,
                              std::optional<torch::Tensor>, int64_t>;

PanelWeight panel_weight(const PanelTuple& packed, const char* name) {
  const auto& [panels, scales, bias, out_features] = packed;
  const bool int8 = panels.scalar_type() == torch::kInt8;
  TORCH_CHECK_VALUE((int8 || panels.scalar_type() == torch::kFloat32) && panels.dim() == 3 &&
                        panels.size(2) == kPanel && panels.is_contiguous(),
                    name, ": contiguous int8 or float32 panels [panels, in_features, 16]");
  TORCH_CHECK_VALUE(int8 == scales.has_value(), name, ": scales for int8 panels only");
  if (scales) {
    TORCH_CHECK_VALUE(scales->scalar_type() == torch::kFloat32 && scales->is_contiguous() &&
                          scales->numel() == panels.size(0) * kPanel,
                      name, ": float32 scales, one per packed channel");
  }
  TORCH_CHECK_VALUE(out_features > (panels.size(0) - 1) * kPanel &&
                        out_features <= panels.size(0) * kPanel,
                    name, ": out_features does not match the panels");
  if (bias) {
    TORCH_CHECK_VALUE(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                          bias->numel() == out_features,
                      name, ": float32 bias [out_features]");
  }
  return {panels, scales, bias, out_features};
}

struct Layer {
  torch::Tensor input_norm, post_attention_norm;
  PanelWeight qkv, o_proj, gate_up, down;
};

// Scratch for one call: each buffer [rows, its width], reused by every layer.
struct Scratch {
  torch::Tensor normed, qkv, q, attended, projected, gate_up, act, hidden;
};

class DecodeLayers {
 public:
  DecodeLayers(std::vector<torch::Tensor> input_norms, std::vector<torch::Tensor> post_norms,
               std::vector<PanelTuple> qkv, std::vector<PanelTuple> o_proj,
               std::vector<PanelTuple> gate_up, std::vector<PanelTuple> down, torch::Tensor cos,
               torch::Tensor sin, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
               double eps, double scale, int64_t sliding_window)
      : cos_(cos), sin_(sin), num_heads_(num_heads), num_kv_heads_(num_kv_heads),
        head_dim_(head_dim), eps_(static_cast<float>(eps)), scale_(static_cast<float>(scale)),
        sliding_window_(sliding_window) {
    const size_t count = input_norms.size();
    TORCH_CHECK_VALUE(count > 0 && post_norms.size() == count && qkv.size() == count &&
                          o_proj.size() == count && gate_up.size() == count && down.size() == count,
                      "layers: as many norms and linears of each kind, at least one");
    TORCH_CHECK_VALUE(num_heads % num_kv_heads == 0 && head_dim % 2 == 0,
                      "heads: a multiple of KV heads, of an even head_dim");
    for (const auto* table : {&cos_, &sin_}) {
      TORCH_CHECK_VALUE(table->scalar_type() == torch::kFloat32 && table->is_contiguous() &&
                            table->dim() == 2 && table->size(1) == head_dim,
                        "cos, sin: contiguous float32 [positions, head_dim]");
    }
    TORCH_CHECK_VALUE(cos_.sizes() == sin_.sizes(), "cos, sin: one shape");
    for (size_t i = 0; i < count; ++i) {
      layers_.push_back({input_norms[i].contiguous(), post_norms[i].contiguous(),
                         panel_weight(qkv[i], "qkv"), panel_weight(o_proj[i], "o_proj"),
                         panel_weight(gate_up[i], "gate_up"), panel_weight(down[i], "down")});
    }
    hidden_size_ = layers_[0].o_proj.out_features;
    const Layer& first = layers_[0];
    TORCH_CHECK_VALUE(first.qkv.out_features == (num_heads + 2 * num_kv_heads) * head_dim &&
                          first.o_proj.in_features() == num_heads * head_dim &&
                          first.qkv.in_features() == hidden_size_ &&
                          first.gate_up.out_features == 2 * first.down.in_features() &&
                          first.down.out_features == hidden_size_,
                      "linears: shapes do not chain");
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // Every layer of a decode-only step: (hidden, residual) as forward.py's loop leaves them after
  // the last layer. The residual is `hidden` itself, updated in place (as the loop's is from its
  // first layer on); the K/V of each layer are written to `kv_cache`.
  std::tuple<torch::Tensor, torch::Tensor> run(torch::Tensor hidden, torch::Tensor positions,
                                               torch::Tensor slot_mapping, torch::Tensor kv_cache,
                                               torch::Tensor block_tables,
                                               torch::Tensor context_lens, int64_t path) const {
    TORCH_CHECK_VALUE(hidden.device().is_cpu() && hidden.scalar_type() == torch::kFloat32 &&
                          hidden.dim() == 2 && hidden.size(1) == hidden_size_ &&
                          hidden.is_contiguous() && hidden.size(0) > 0,
                      "hidden: contiguous float32 [rows, hidden_size] on the CPU");
    const int64_t rows = hidden.size(0);
    check_step(rows, positions, slot_mapping, kv_cache, block_tables, context_lens);
    TORCH_CHECK_VALUE(path >= kPortable && path <= kAvx512,
                      "path: 0 (portable), 1 (AVX2), 2 (AVX-512)");
    path = std::min(path, widest_path_here());
    const Scratch scratch = scratch_for(rows, hidden.options());
    const DecodePieces plan =
        plan_pieces(context_lens.data_ptr<int32_t>(), rows, num_kv_heads_, sliding_window_);
    const float* layer_input = hidden.data_ptr<float>();
    for (size_t index = 0; index < layers_.size(); ++index) {
      const Layer& layer = layers_[index];
      // Layer 0 normalizes the embedding as it is: it becomes the residual.
      norm_rows(layer_input, hidden, layer.input_norm, scratch.normed, index > 0);
      attention(static_cast<int64_t>(index), layer, scratch, positions, slot_mapping, kv_cache,
                block_tables, plan, path);
      norm_rows(scratch.projected.data_ptr<float>(), hidden, layer.post_attention_norm,
                scratch.normed, true);
      mlp(layer, scratch, path);
      layer_input = scratch.hidden.data_ptr<float>();
    }
    return {scratch.hidden, hidden};
  }

 private:
  // Every index the step's pointers are formed from, checked before anything is written: the
  // kernels read and write where they point without bounds checks.
  void check_step(int64_t rows, const torch::Tensor& positions, const torch::Tensor& slot_mapping,
                  const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                  const torch::Tensor& context_lens) const {
    TORCH_CHECK_VALUE(kv_cache.scalar_type() == torch::kFloat32 && kv_cache.is_contiguous() &&
                          kv_cache.dim() == 6 && kv_cache.size(0) == num_layers() &&
                          kv_cache.size(1) == 2 && kv_cache.size(4) == num_kv_heads_ &&
                          kv_cache.size(5) == head_dim_,
                      "kv_cache: contiguous float32 [layers, 2, blocks, block_size, kv_heads, head_dim]");
    const int64_t num_blocks = kv_cache.size(2), block_size = kv_cache.size(3);
    check_indices(positions, torch::kInt64, rows, cos_.size(0), "positions");
    check_indices(slot_mapping, torch::kInt64, rows, num_blocks * block_size, "slot_mapping");
    TORCH_CHECK_VALUE(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous() &&
                          block_tables.dim() == 2 && block_tables.size(0) == rows,
                      "block_tables: contiguous int32 [rows, max_blocks]");
    check_indices(block_tables, torch::kInt32, block_tables.numel(), num_blocks, "block_tables");
    const int64_t capacity = block_tables.size(1) * block_size;
    check_indices(context_lens, torch::kInt32, rows, capacity + 1, "context_lens");
    const int32_t* lengths = context_lens.data_ptr<int32_t>();
    for (int64_t row = 0; row < rows; ++row) {
      TORCH_CHECK_VALUE(lengths[row] >= 1, "context_lens[", row, "]: ", lengths[row],
                        " is outside 1..", capacity);
    }
  }

  static void check_indices(const torch::Tensor& t, torch::ScalarType type, int64_t count,
                            int64_t bound, const char* name) {
    TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() &&
                          t.numel() == count,
                      name, ": ", count, " contiguous ", c10::toString(type), " on the CPU");
    const auto check = [&](const auto* data) {
      for (int64_t i = 0; i < count; ++i) {
        TORCH_CHECK_VALUE(data[i] >= 0 && data[i] < bound, name, "[", i, "]: ", data[i],
                          " is outside 0..", bound - 1);
      }
    };
    if (type == torch::kInt64) {
      check(t.data_ptr<int64_t>());
    } else {
      check(t.data_ptr<int32_t>());
    }
  }

  Scratch scratch_for(int64_t rows, const torch::TensorOptions& options) const {
    const Layer& layer = layers_[0];
    const auto buffer = [&](int64_t width) { return torch::empty({rows, width}, options); };
    return {buffer(hidden_size_),          buffer(layer.qkv.out_features),
            buffer(num_heads_ * head_dim_), buffer(num_heads_ * head_dim_),
            buffer(hidden_size_),          buffer(layer.gate_up.out_features),
            buffer(layer.down.in_features()), buffer(hidden_size_)};
  }

  // add_rms_norm's rows: `sum` += `input` (when `add`), `out` = RMSNorm(`sum`) * weight.
  void norm_rows(const float* input, const torch::Tensor& sum, const torch::Tensor& weight,
                 const torch::Tensor& out, bool add) const {
    const int64_t rows = sum.size(0), width = hidden_size_;
    float* sum_data = sum.data_ptr<float>();
    float* out_data = out.data_ptr<float>();
    const float* weight_data = weight.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(width), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        add_rms_norm_row(input + row * width, sum_data + row * width, weight_data,
                         out_data + row * width, width, eps_, add);
      }
    });
  }

  void attention(int64_t index, const Layer& layer, const Scratch& scratch,
                 const torch::Tensor& positions, const torch::Tensor& slot_mapping,
                 const torch::Tensor& kv_cache, const torch::Tensor& block_tables,
                 const DecodePieces& plan, int64_t path) const {
    const int64_t rows = scratch.qkv.size(0), width = layer.qkv.out_features;
    const int64_t q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
    float* qkv = scratch.qkv.data_ptr<float>();
    linear_into(scratch.normed.data_ptr<float>(), rows, layer.qkv.panels,
                layer.qkv.scales_data(), layer.qkv.bias_data(), width, qkv, path);
    const int64_t num_blocks = kv_cache.size(2), block_size = kv_cache.size(3);
    const int64_t block_stride = block_size * kv_size;
    float* k_cache = kv_cache.data_ptr<float>() + (index * 2) * num_blocks * block_stride;
    float* v_cache = k_cache + num_blocks * block_stride;
    const int64_t* position = positions.data_ptr<int64_t>();
    const int64_t* slot = slot_mapping.data_ptr<int64_t>();
    float* q = scratch.q.data_ptr<float>();
    for (int64_t row = 0; row < rows; ++row) {
      float* token = qkv + row * width;
      const float* cos = cos_.data_ptr<float>() + position[row] * head_dim_;
      const float* sin = sin_.data_ptr<float>() + position[row] * head_dim_;
      for (int64_t head = 0; head < num_heads_ + num_kv_heads_; ++head) {
        rotate_head(token + head * head_dim_, cos, sin, head_dim_ / 2);
      }
      std::memcpy(k_cache + slot[row] * kv_size, token + q_size, kv_size * sizeof(float));
      std::memcpy(v_cache + slot[row] * kv_size, token + q_size + kv_size, kv_size * sizeof(float));
      std::memcpy(q + row * q_size, token, q_size * sizeof(float));
    }
    const Shapes shapes{num_heads_, num_kv_heads_, head_dim_, block_size,
                        block_tables.size(1), block_stride, kv_size};
    run_pieces(q, k_cache, v_cache, block_tables.data_ptr<int32_t>(), shapes, plan, rows, scale_,
               scratch.attended.data_ptr<float>());
    linear_into(scratch.attended.data_ptr<float>(), rows, layer.o_proj.panels,
                layer.o_proj.scales_data(), layer.o_proj.bias_data(), hidden_size_,
                scratch.projected.data_ptr<float>(), path);
  }

  void mlp(const Layer& layer, const Scratch& scratch, int64_t path) const {
    const int64_t rows = scratch.normed.size(0), width = layer.down.in_features();
    float* gate_up = scratch.gate_up.data_ptr<float>();
    float* act = scratch.act.data_ptr<float>();
    linear_into(scratch.normed.data_ptr<float>(), rows, layer.gate_up.panels,
                layer.gate_up.scales_data(), layer.gate_up.bias_data(), 2 * width, gate_up, path);
    at::parallel_for(0, rows, grain_rows(width), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const float* gate = gate_up + row * 2 * width;
        silu_and_mul_row(gate, gate + width, act + row * width, width);
      }
    });
    linear_into(act, rows, layer.down.panels, layer.down.scales_data(), layer.down.bias_data(),
                hidden_size_, scratch.hidden.data_ptr<float>(), path);
  }

  std::vector<Layer> layers_;
  torch::Tensor cos_, sin_;  // [positions, head_dim], the rotary tables forward.py looks up
  int64_t num_heads_, num_kv_heads_, head_dim_, hidden_size_ = 0;
  float eps_, scale_;
  int64_t sliding_window_;  // 0: none
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<DecodeLayers>(m, "DecodeLayers")
      .def(pybind11::init<std::vector<torch::Tensor>, std::vector<torch::Tensor>,
                          std::vector<PanelTuple>, std::vector<PanelTuple>, std::vector<PanelTuple>,
                          std::vector<PanelTuple>, torch::Tensor, torch::Tensor, int64_t, int64_t,
                          int64_t, double, double, int64_t>(),
           pybind11::arg("input_norms"), pybind11::arg("post_attention_norms"),
           pybind11::arg("qkv"), pybind11::arg("o_proj"), pybind11::arg("gate_up"),
           pybind11::arg("down"), pybind11::arg("cos"), pybind11::arg("sin"),
           pybind11::arg("num_heads"), pybind11::arg("num_kv_heads"), pybind11::arg("head_dim"),
           pybind11::arg("eps"), pybind11::arg("scale"), pybind11::arg("sliding_window"))
      .def_property_readonly("num_layers", &DecodeLayers::num_layers)
      // The GIL is let go for the step (the kernels touch tensors only): the server's threads
      // run meanwhile, as they do while a torch op runs.
      .def("run", &DecodeLayers::run, pybind11::call_guard<pybind11::gil_scoped_release>(),
           "every layer of a decode-only step -> (hidden, residual)", pybind11::arg("hidden"),
           pybind11::arg("positions"), pybind11::arg("slot_mapping"), pybind11::arg("kv_cache"),
           pybind11::arg("block_tables"), pybind11::arg("context_lens"), pybind11::arg("path"));
}
