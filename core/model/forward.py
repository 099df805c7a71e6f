"""pdserve's own forward pass of the Llama family over the paged KV cache.

Like vLLM and nano-vllm, the model is written here rather than wrapped from transformers: it reads
and writes K/V through block tables and slot mappings (`pdserve.kernels`), computes logits only
for the tokens that need them, and fuses q/k/v and gate/up into one matmul each. On the CPU in
float32 a decode-only step runs every layer in one C++ call (kernels/decode_step.py: the same
kernels as the loop below, bit for bit, without the Python and torch ops between them;
`PDSERVE_FUSED_DECODE=off` runs the loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from pdserve.core.forward_batch import ForwardBatch
from pdserve.core.kv.cache import KVCache
from pdserve.core.model.config import ModelConfig
from pdserve.core.model.gemm import (
    PANEL_FORMATS,
    LinearWeight,
    cpu_float32_backend,
    linear,
    prepare,
)
from pdserve.core.model.precision import check_supported
from pdserve.core.model.rotary import RotaryEmbedding
from pdserve.kernels import (
    DecodePlan,
    cpu_panel_linear,
    decode_step,
    paged_attention_prefill,
    plan_decode,
    run_planned_decode,
    write_kv,
)
from pdserve.kernels.kv_quant import is_quantized
from pdserve.kernels.layer_ops import add_rms_norm, apply_rotary, silu_and_mul


def cpu_float32_forward() -> str:
    """What runs a float32 forward on the CPU, for whoever keys measurements by it (host
    profiles): the matmul backend (gemm.py `cpu_float32_backend`), and whether a decode step's
    layers run in one call (kernels/decode_step.py: its steps are shorter, so a profile of the
    loop misprices them)."""
    backend = cpu_float32_backend()
    return f"{backend}+one-call-decode" if decode_step.kernel() is not None else backend


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: LinearWeight  # q, k and v projections stacked on the output dim
    o_proj: LinearWeight
    post_attention_norm: torch.Tensor
    gate_up: LinearWeight  # gate and up projections stacked on the output dim
    down: LinearWeight


class CausalLM:
    def __init__(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], quantization: str = "none"
    ) -> None:
        self.config = config
        self.embed = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"]
        self.lm_head = prepare(weights.get("lm_head.weight", self.embed), None, quantization)
        self.layers = [
            _layer_weights(weights, i, config, quantization) for i in range(config.num_layers)
        ]
        self.rotary = RotaryEmbedding(config, self.embed.dtype, self.embed.device)
        self.scale = config.head_dim**-0.5
        self._q_size = config.num_heads * config.head_dim
        self._kv_size = config.num_kv_heads * config.head_dim
        # Set where a decode-only step can run all layers in one call (`_decode_layers`).
        self.decode_layers = self._decode_layers()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        kv_cache: KVCache,
        after_layer: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Runs every token of the batch; returns logits `[num_sequences, vocab]` in float32.
        `after_layer(i)` runs once layer i's K/V is in the cache (layer-wise KV push)."""
        hidden = F.embedding(batch.input_ids, self.embed)
        if self._runs_in_one_call(batch, kv_cache, after_layer):
            assert self.decode_layers is not None and batch.decode is not None
            hidden, residual = self.decode_layers.run(
                hidden,
                batch.positions,
                batch.slot_mapping,
                kv_cache.tensor,
                batch.decode.block_tables,
                batch.decode.context_lens,
                cpu_panel_linear.path_to_run(),
            )
        else:
            hidden, residual = self._layer_by_layer(hidden, batch, kv_cache, after_layer)
        last = batch.logits_indices
        normed, _ = add_rms_norm(hidden[last], residual[last], self.norm, self.config.rms_norm_eps)
        return linear(normed, self.lm_head).float()

    def _runs_in_one_call(
        self, batch: ForwardBatch, kv_cache: KVCache, after_layer: Callable[[int], None] | None
    ) -> bool:
        """A decode-only step on a float32 cache, with no hook between the layers."""
        return (
            self.decode_layers is not None
            and after_layer is None
            and batch.prefill is None
            and batch.decode is not None
            and kv_cache.tensor.dtype == torch.float32
        )

    def _layer_by_layer(
        self,
        hidden: torch.Tensor,
        batch: ForwardBatch,
        kv_cache: KVCache,
        after_layer: Callable[[int], None] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual: torch.Tensor | None = None
        # Per-step work, done once for all layers: rotary lookup, decode gather indices. Layer 0's
        # kernel calls check the step's arguments; the other layers' (same shapes) skip that.
        cos_sin = self.rotary.cos_sin(batch.positions)
        decode_plan = self._plan_decode(batch, kv_cache)
        eps = self.config.rms_norm_eps
        for index, layer in enumerate(self.layers):
            hidden, residual = add_rms_norm(hidden, residual, layer.input_norm, eps)
            hidden = self._attention(index, layer, hidden, cos_sin, batch, decode_plan, kv_cache)
            if after_layer is not None:
                after_layer(index)
            hidden, residual = add_rms_norm(hidden, residual, layer.post_attention_norm, eps)
            hidden = self._mlp(layer, hidden)
        assert residual is not None  # at least one layer ran
        return hidden, residual

    def _decode_layers(self) -> decode_step.DecodeLayers | None:
        """The layers in one C++ object where every part has its CPU kernel: float32 on the CPU,
        every weight in panels (float32 or int8); None elsewhere (the loop runs)."""
        if self.embed.device.type != "cpu" or self.dtype != torch.float32:
            return None
        linears = {
            name: [getattr(layer, name) for layer in self.layers]
            for name in ("qkv", "o_proj", "gate_up", "down")
        }
        if any(weight.format not in PANEL_FORMATS for kind in linears.values() for weight in kind):
            return None
        config = self.config
        return decode_step.decode_layers(
            norms=(  # made contiguous by the kernel, once
                [layer.input_norm for layer in self.layers],
                [layer.post_attention_norm for layer in self.layers],
            ),
            linears={name: [_packed(weight) for weight in kind] for name, kind in linears.items()},
            cos_sin=(self.rotary.cos, self.rotary.sin),
            shapes=decode_step.LayerShapes(
                num_heads=config.num_heads,
                num_kv_heads=config.num_kv_heads,
                head_dim=config.head_dim,
                rms_norm_eps=config.rms_norm_eps,
                scale=self.scale,
                sliding_window=config.sliding_window or 0,
            ),
        )

    def _plan_decode(self, batch: ForwardBatch, kv_cache: KVCache) -> DecodePlan | None:
        if batch.decode is None:
            return None
        return plan_decode(
            batch.decode.block_tables,
            batch.decode.context_lens,
            kv_cache.layout.block_size,
            self.config.sliding_window,
            int8_kv=is_quantized(kv_cache.tensor),
            dtype=self.dtype,
        )

    def _attention(
        self,
        index: int,
        layer: LayerWeights,
        hidden: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        decode_plan: DecodePlan | None,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        config = self.config
        num_tokens = hidden.shape[0]
        qkv = linear(hidden, layer.qkv)
        qk, v = torch.split(qkv, [self._q_size + self._kv_size, self._kv_size], dim=-1)
        # q and k heads rotate together: half the small ops of rotating them one by one.
        qk = apply_rotary(qk.view(num_tokens, -1, config.head_dim), *cos_sin)
        q, k = torch.split(qk, [config.num_heads, config.num_kv_heads], dim=1)
        v = v.reshape(num_tokens, config.num_kv_heads, config.head_dim)
        k_cache, v_cache = kv_cache.k(index), kv_cache.v(index)
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping, checked=index > 0)
        attended = self._attend(q, k_cache, v_cache, batch, decode_plan, checked=index > 0)
        return linear(attended.view(num_tokens, -1), layer.o_proj)

    def _attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: ForwardBatch,
        decode_plan: DecodePlan | None,
        checked: bool,
    ) -> torch.Tensor:
        window = self.config.sliding_window
        parts = []
        split = batch.num_decode_tokens
        if decode_plan is not None:
            decode_q = q[:split]
            parts.append(
                run_planned_decode(decode_q, k_cache, v_cache, decode_plan, self.scale, checked)
            )
        if batch.prefill is not None:
            parts.append(
                paged_attention_prefill(
                    q[split:],
                    k_cache,
                    v_cache,
                    batch.prefill.block_tables,
                    batch.prefill.query_start_loc,
                    batch.prefill.context_lens,
                    self.scale,
                    sliding_window=window,
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _mlp(self, layer: LayerWeights, hidden: torch.Tensor) -> torch.Tensor:
        return linear(silu_and_mul(linear(hidden, layer.gate_up)), layer.down)


def _packed(weight: LinearWeight) -> decode_step.PackedLinear:
    return weight.weight, weight.scales, weight.bias, weight.out_features


def _layer_weights(
    weights: dict[str, torch.Tensor], index: int, config: ModelConfig, quantization: str
) -> LayerWeights:
    prefix = f"model.layers.{index}."

    def get(name: str) -> torch.Tensor:
        return weights[prefix + name]

    qkv_names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    bias = torch.cat([get(f"{name}.bias") for name in qkv_names]) if config.attention_bias else None
    return LayerWeights(
        input_norm=get("input_layernorm.weight"),
        qkv=prepare(torch.cat([get(f"{name}.weight") for name in qkv_names]), bias, quantization),
        o_proj=prepare(get("self_attn.o_proj.weight"), None, quantization),
        post_attention_norm=get("post_attention_layernorm.weight"),
        gate_up=prepare(
            torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]), None, quantization
        ),
        down=prepare(get("mlp.down_proj.weight"), None, quantization),
    )


def load_model(
    model_dir: Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str = "none",
) -> CausalLM:
    """Loads every `*.safetensors` file of the folder (sharded or not) into a `CausalLM`;
    refuses a dtype / quantization the device cannot run (UnsupportedPrecisionError)."""
    check_supported(dtype, quantization, device)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model: no *.safetensors weights in {model_dir}")
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                weights[name] = handle.get_tensor(name).to(dtype=dtype, device=device)
    return CausalLM(config, weights, quantization)
