"""A decode step's layers in one call (kernels/cpu_decode_step.cpp) against the per-op loop of
core/model/forward.py: the same logits and the same cache, bit for bit, at the default model's
layer shapes (and a Qwen2-like one with attention bias), batches of 1 to 64 ragged contexts up to
4,000 tokens, with and without a sliding window, float32 and int8 panels, every vector path this
CPU runs; errors that name the argument before anything is written; which steps take it; and
the engine on the real model, switched on, gives transformers' greedy tokens; host profiles of
the two paths are kept apart."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
import torch

from pdserve.core.forward_batch import DecodeMetadata, ForwardBatch, PrefillMetadata
from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.llm import LLM
from pdserve.core.model.config import ModelConfig, RopeConfig
from pdserve.core.model.forward import CausalLM, cpu_float32_forward
from pdserve.core.model.gemm import cpu_float32_backend
from pdserve.core.sampling_params import SamplingParams
from pdserve.kernels import cpu_panel_linear, decode_step
from pdserve.kernels.cpu_panel_linear import VectorPath
from tests.kernels.built import built_kernel

BLOCK_SIZE = 16
# SmolLM2-135M's layer (9 query heads over 3 KV heads of 64), four of them.
SMOLLM2 = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=512,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=4,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    max_position=8192,
    tie_word_embeddings=True,
    attention_bias=False,
    rope=RopeConfig(theta=100000.0),
    sliding_window=None,
)
QWEN2_LIKE = replace(SMOLLM2, num_heads=8, num_kv_heads=2, head_dim=72, attention_bias=True)
CONTEXTS = [1, 15, 16, 17, 87, 300]  # around block edges, and past a 256-token piece


@pytest.fixture(scope="module", autouse=True)
def switched_on() -> Iterator[None]:
    """`PDSERVE_FUSED_DECODE=on` for the module (the default, set against the caller's
    environment); the kernel built."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(decode_step.SWITCH, "on")
        decode_step.kernel.cache_clear()
        built_kernel(decode_step.kernel)
        yield
    decode_step.kernel.cache_clear()


@pytest.fixture
def path() -> Iterator[None]:
    """Restores the panel path a test sets."""
    yield
    cpu_panel_linear.PATH = None


@cache
def _model(config: ModelConfig, quantization: str = "none") -> CausalLM:
    """One model per shape and quantization for the module (tests that change one make their
    own: `_fresh_model`)."""
    return _fresh_model(config, quantization)


def _fresh_model(config: ModelConfig, quantization: str = "none") -> CausalLM:
    return CausalLM(config, _weights(config), quantization)


def _weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Random weights of the config's shapes, at scales that keep the activations moderate."""
    generator = torch.Generator().manual_seed(0)

    def weight(*shape: int, scale: float = 0.05) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    hidden, q = config.hidden_size, config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    weights = {"model.embed_tokens.weight": weight(config.vocab_size, hidden, scale=1.0)}
    weights["model.norm.weight"] = 1 + weight(hidden)
    for i in range(config.num_layers):
        layer = f"model.layers.{i}."
        for name, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            weights[f"{layer}self_attn.{name}.weight"] = weight(out, hidden)
            if config.attention_bias:
                weights[f"{layer}self_attn.{name}.bias"] = weight(out, scale=0.5)
        weights[f"{layer}self_attn.o_proj.weight"] = weight(hidden, q)
        weights[f"{layer}mlp.gate_proj.weight"] = weight(config.intermediate_size, hidden)
        weights[f"{layer}mlp.up_proj.weight"] = weight(config.intermediate_size, hidden)
        weights[f"{layer}mlp.down_proj.weight"] = weight(hidden, config.intermediate_size)
        weights[f"{layer}input_layernorm.weight"] = 1 + weight(hidden)
        weights[f"{layer}post_attention_layernorm.weight"] = 1 + weight(hidden)
    return weights


def _cache(config: ModelConfig, num_blocks: int, dtype: str = "float32") -> KVCache:
    layout = KVLayout(config.num_layers, config.num_kv_heads, config.head_dim, BLOCK_SIZE, dtype)
    cache = KVCache(layout, num_blocks, "cpu")
    if dtype == "float32":  # earlier tokens' K/V
        cache.tensor.copy_(
            torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(1))
        )
    return cache


def _decode_step(contexts: list[int], num_blocks: int, vocab: int) -> ForwardBatch:
    """One decode token per sequence, its blocks drawn at random from the cache."""
    rng = random.Random(len(contexts))
    needed = [-(-length // BLOCK_SIZE) for length in contexts]
    blocks = rng.sample(range(num_blocks), sum(needed))
    tables, slots = [], []
    for length, count in zip(contexts, needed, strict=True):
        row, blocks = blocks[:count], blocks[count:]
        tables.append(row + [0] * (max(needed) - count))
        slots.append(row[(length - 1) // BLOCK_SIZE] * BLOCK_SIZE + (length - 1) % BLOCK_SIZE)
    rows = len(contexts)
    return ForwardBatch(
        input_ids=torch.tensor([rng.randrange(vocab) for _ in contexts]),
        positions=torch.tensor([length - 1 for length in contexts]),
        slot_mapping=torch.tensor(slots),
        num_decode_tokens=rows,
        decode=DecodeMetadata(
            torch.tensor(tables, dtype=torch.int32), torch.tensor(contexts, dtype=torch.int32)
        ),
        prefill=None,
        logits_indices=torch.arange(rows),
    )


def _both_ways(
    model: CausalLM, batch: ForwardBatch, num_blocks: int
) -> tuple[tuple[torch.Tensor, KVCache], tuple[torch.Tensor, KVCache]]:
    """(logits, cache) of the step in one call, then layer by layer on a twin cache."""
    assert model.decode_layers is not None, "the model must run the one-call path here"
    fused_cache, loop_cache = _cache(model.config, num_blocks), _cache(model.config, num_blocks)
    fused = model.forward(batch, fused_cache)
    layers, model.decode_layers = model.decode_layers, None
    try:
        looped = model.forward(batch, loop_cache)
    finally:
        model.decode_layers = layers
    return (fused, fused_cache), (looped, loop_cache)


def _assert_identical(model: CausalLM, contexts: list[int]) -> None:
    num_blocks = sum(-(-length // BLOCK_SIZE) for length in contexts) + 8  # a few never read
    batch = _decode_step(contexts, num_blocks, model.config.vocab_size)
    (fused, fused_cache), (looped, loop_cache) = _both_ways(model, batch, num_blocks)
    assert torch.equal(fused, looped), (fused - looped).abs().max()
    assert torch.equal(fused_cache.tensor, loop_cache.tensor)


def _ragged(rows: int) -> list[int]:
    return [CONTEXTS[i % len(CONTEXTS)] + i for i in range(rows)]


def _paths_here() -> list[VectorPath]:
    widest = cpu_panel_linear.widest_path_here()
    return [] if widest is None else [p for p in VectorPath if p <= widest]


@pytest.mark.parametrize("quantization", ["none", "int8"])
@pytest.mark.parametrize("rows", [1, 3, 16, 64])
def test_a_ragged_batch_is_the_loop_bit_for_bit(quantization: str, rows: int) -> None:
    _assert_identical(_model(SMOLLM2, quantization), _ragged(rows))


@pytest.mark.parametrize("vector_path", _paths_here(), ids=lambda p: p.name)
def test_every_vector_path_is_the_loop_on_the_same_path(
    vector_path: VectorPath, path: None
) -> None:
    cpu_panel_linear.PATH = vector_path
    _assert_identical(_model(SMOLLM2), _ragged(5))


def test_the_longest_context_at_batch_1() -> None:
    _assert_identical(_model(SMOLLM2), [4000])


@pytest.mark.parametrize("window", [64, 300])
def test_a_sliding_window_is_the_loop(window: int) -> None:
    _assert_identical(_model(replace(SMOLLM2, sliding_window=window)), [1, 63, 64, 65, 299, 700])


def test_attention_bias_and_other_head_shapes_are_the_loop() -> None:
    _assert_identical(_model(QWEN2_LIKE), _ragged(7))


def _slots_past_the_cache(batch: ForwardBatch) -> ForwardBatch:
    return replace(batch, slot_mapping=batch.slot_mapping + 10**6)


def _positions_past_the_rotary_table(batch: ForwardBatch) -> ForwardBatch:
    return replace(batch, positions=batch.positions + 10**6)


def _negative_block_ids(batch: ForwardBatch) -> ForwardBatch:
    assert batch.decode is not None
    return replace(batch, decode=replace(batch.decode, block_tables=batch.decode.block_tables - 1))


def _empty_contexts(batch: ForwardBatch) -> ForwardBatch:
    assert batch.decode is not None
    return replace(batch, decode=replace(batch.decode, context_lens=batch.decode.context_lens * 0))


@pytest.mark.parametrize(
    ("bad", "argument"),
    [
        (_slots_past_the_cache, "slot_mapping"),
        (_positions_past_the_rotary_table, "positions"),
        (_negative_block_ids, "block_tables"),
        (_empty_contexts, "context_lens"),
    ],
)
def test_a_bad_index_names_its_argument_and_writes_nothing(
    bad: Callable[[ForwardBatch], ForwardBatch], argument: str
) -> None:
    cache = _cache(SMOLLM2, 400)
    before = cache.tensor.clone()
    with pytest.raises(ValueError, match=argument):
        _model(SMOLLM2).forward(bad(_decode_step([5, 40], 400, SMOLLM2.vocab_size)), cache)
    assert torch.equal(cache.tensor, before)


class _Spy:
    """Counts the one-call path's steps of a model."""

    def __init__(self, model: CausalLM) -> None:
        assert model.decode_layers is not None
        self.layers, self.calls = model.decode_layers, 0
        model.decode_layers = self  # type: ignore[assignment]

    def run(self, *arguments: object) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        return self.layers.run(*arguments)  # type: ignore[arg-type]


def test_only_a_decode_only_step_on_a_float32_cache_without_a_hook_takes_it() -> None:
    model = _fresh_model(SMOLLM2)
    spy = _Spy(model)
    batch = _decode_step([5, 40], 400, SMOLLM2.vocab_size)
    model.forward(batch, _cache(SMOLLM2, 400))
    assert spy.calls == 1
    model.forward(batch, _cache(SMOLLM2, 400), after_layer=lambda _: None)  # layer-wise push
    model.forward(batch, _cache(SMOLLM2, 400, dtype="int8"))  # read by the torch path only
    prefill = PrefillMetadata(
        torch.tensor([[7]], dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([1], dtype=torch.int32),
    )
    mixed = replace(
        batch,
        input_ids=torch.cat([batch.input_ids, torch.tensor([3])]),
        positions=torch.cat([batch.positions, torch.tensor([0])]),
        slot_mapping=torch.cat([batch.slot_mapping, torch.tensor([7 * BLOCK_SIZE])]),
        prefill=prefill,
        logits_indices=torch.tensor([0, 1, 2]),
    )
    model.forward(mixed, _cache(SMOLLM2, 400))
    assert spy.calls == 1


def test_other_dtypes_and_the_switch_keep_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    config = replace(SMOLLM2, num_layers=1)
    assert _fresh_model(config).decode_layers is not None
    bfloat16 = {name: tensor.to(torch.bfloat16) for name, tensor in _weights(config).items()}
    assert CausalLM(config, bfloat16).decode_layers is None
    monkeypatch.setenv(decode_step.SWITCH, "off")
    decode_step.kernel.cache_clear()
    assert _fresh_model(config).decode_layers is None
    monkeypatch.delenv(decode_step.SWITCH)  # unset: on, the default
    decode_step.kernel.cache_clear()
    assert _fresh_model(config).decode_layers is not None
    monkeypatch.setenv(decode_step.SWITCH, "on")
    decode_step.kernel.cache_clear()


def test_the_engine_on_the_real_model_gives_transformers_greedy_tokens(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    llm = LLM(model_dir, num_kv_blocks=256)
    assert llm.engine.runner.model.decode_layers is not None
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0))
    assert [list(out.outputs[0].token_ids) for out in outputs] == hf_greedy


def test_a_host_profile_keys_the_one_call_path_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host profiles are cached per `cpu_float32_forward()`: the loop's profile would price the
    one-call steps long."""
    assert cpu_float32_forward() == f"{cpu_float32_backend()}+one-call-decode"
    monkeypatch.setenv(decode_step.SWITCH, "off")
    decode_step.kernel.cache_clear()
    assert cpu_float32_forward() == cpu_float32_backend()
    monkeypatch.setenv(decode_step.SWITCH, "on")
    decode_step.kernel.cache_clear()
