"""Turns the last logits of each sequence into its next token.

Sampling uses the exponential race (`argmax(p / E)` with `E ~ Exp(1)`), which draws exactly from
`p`, and each seeded request draws its noise from its own `SeededNoise`: the same seed gives the
same tokens whether the request runs alone or inside a busy batch, and wherever it resumes.
"""

from __future__ import annotations

import torch

from pdserve.core.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    noises: list[SeededNoise | None],
) -> list[int]:
    """`logits` `[num_seqs, vocab]` float32; one SamplingParams and seeded noise (None:
    unseeded) per row."""
    tokens = logits.argmax(dim=-1)
    sampled_rows = [row for row, p in enumerate(params) if not p.greedy]
    if sampled_rows:
        rows = torch.tensor(sampled_rows)
        probs = _filtered_probs(logits[rows], [params[row] for row in sampled_rows])
        noise = torch.stack([_exponential(probs.shape[-1], noises[row]) for row in sampled_rows])
        tokens[rows] = (probs / noise).argmax(dim=-1)
    return [int(token) for token in tokens.tolist()]


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    temperatures = torch.tensor(
        [p.temperature for p in params], dtype=logits.dtype, device=logits.device
    )
    logits = logits / temperatures.unsqueeze(1)
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        logits = _top_k_top_p(logits, params)
    return torch.softmax(logits, dim=-1)


def _top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    device = logits.device
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    drop = ranks >= top_k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype, device=device)
    # Drop a token when the tokens ranked above it already cover top_p (the first always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class SeededNoise:
    """A seeded request's noise, counter-based: the noise of its i-th sampled token comes from a
    generator seeded with (seed, i) alone. So a request resumed after k tokens sampled elsewhere
    (the first token on a prefill worker, a migration's streamed output) starts at i = k at once:
    replaying k draws of vocabulary-size noise, as one generator per request had to, cost about
    10^9 draws on the engine thread for an 8k-token stream on a 128k vocabulary."""

    __slots__ = ("_generator", "index", "seed")

    def __init__(self, seed: int, index: int = 0) -> None:
        self.seed = seed
        self.index = index  # tokens sampled so far
        self._generator = torch.Generator()

    def draw(self, size: int) -> torch.Tensor:
        """`size` Exp(1) draws for the next token."""
        self._generator.manual_seed(_token_seed(self.seed, self.index))
        self.index += 1
        return torch.empty(size).exponential_(generator=self._generator)


def seeded_noise(params: SamplingParams, tokens_sampled_before: int) -> SeededNoise | None:
    """The request's noise (None when unseeded), past the tokens sampled for it elsewhere."""
    if params.seed is None:
        return None
    return SeededNoise(params.seed, tokens_sampled_before)


_MASK64 = (1 << 64) - 1


def _token_seed(seed: int, index: int) -> int:
    """splitmix64 of (seed, index): neighbouring pairs (sample i's seed is seed + i) get
    unrelated generator seeds."""
    mixed = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mixed ^ (mixed >> 31)


def _exponential(size: int, noise: SeededNoise | None) -> torch.Tensor:
    if noise is None:
        return torch.empty(size).exponential_()
    return noise.draw(size)
