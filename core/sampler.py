"""Turns the last logits of each sequence into its next token.

Sampling uses the exponential race (`argmax(p / E)` with `E ~ Exp(1)`), which draws exactly from
`p`, and each seeded request draws its noise from its own generator: the same seed gives the same
tokens whether the request runs alone or inside a busy batch.
"""

from __future__ import annotations

import torch

from pdserve.core.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """`logits` `[num_seqs, vocab]` float32; one SamplingParams and generator per row."""
    tokens = logits.argmax(dim=-1)
    sampled_rows = [row for row, p in enumerate(params) if not p.greedy]
    if sampled_rows:
        rows = torch.tensor(sampled_rows)
        probs = _filtered_probs(logits[rows], [params[row] for row in sampled_rows])
        noise = torch.stack(
            [_exponential(probs.shape[-1], generators[row]) for row in sampled_rows]
        )
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


def seeded_generator(
    params: SamplingParams, vocab_size: int, tokens_sampled_before: int
) -> torch.Generator | None:
    """The request's own generator (None when unseeded), past the noise of the tokens sampled
    for it elsewhere: the first token on a prefill worker, or the output a lost decode worker
    streamed before a migration. Each sampled token draws exactly `vocab_size` exponentials, so
    skipping them continues the seeded sequence where it stopped. A resumed migration of a long
    output pays for this once (about 50 M draws for 1,000 tokens of a 49 k vocabulary)."""
    if params.seed is None:
        return None
    generator = torch.Generator().manual_seed(params.seed)
    if not params.greedy:
        for _ in range(tokens_sampled_before):
            _exponential(vocab_size, generator)
    return generator


def _exponential(size: int, generator: torch.Generator | None) -> torch.Tensor:
    return torch.empty(size).exponential_(generator=generator)
