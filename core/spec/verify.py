"""Verification of one request's drafts: which to keep, and the target's own next token.

The runner hands the target's logits at the request's last real token and at each draft: row i
predicts the token after draft i - 1 (row 0 the token after the context). Position by position
the target's own token is drawn exactly as a step without drafts would draw it (`sampler.sample`,
with the request's seeded noise); a draft is kept while it equals that token, and the first token
that differs, or the one after the last draft, ends the step. So the output is the target's:
greedy requests get the argmax tokens they get without speculation, and a seeded request draws
the same noise in the same order (one draw per emitted token), so it gets the same tokens too,
as far as the target's logits are the same.

This is the standard speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023) for a
draft that is a single token, as an n-gram's is (a point mass q = 1 at the draft `d`): the rule
accepts `d` with probability min(1, p(d) / q(d)) = p(d) and otherwise samples from
norm(max(0, p - q)), which is `p` without `d`. Drawing `t ~ p` and keeping `d` when `t == d` does
both at once: P(keep) = p(d), and a rejected step emits `t ~ p` given `t != d`. A draft model
with a spread distribution q would need the general rule (a uniform draw against p / q and the
residual distribution); docs/speculative.md says what that takes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.core.sampler import SeededNoise, sample
from pdserve.core.sampling_params import SamplingParams


def verify_drafts(
    logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    noise: SeededNoise | None,
) -> list[int]:
    """`logits` `[len(drafts) + 1, vocab]`: the tokens to emit, the drafts the target agrees
    with and then its own next token (between 1 and len(drafts) + 1 tokens)."""
    if params.greedy:  # no noise to keep in order: all positions at once
        targets = [int(token) for token in logits.argmax(dim=-1).tolist()]
        return _kept(targets, drafts)
    emitted: list[int] = []
    for row in range(len(drafts) + 1):
        # One row at a time: a position after the first disagreement must draw no noise.
        token = sample(logits[row : row + 1], [params], [noise])[0]
        emitted.append(token)
        if row == len(drafts) or token != drafts[row]:
            break
    return emitted


def _kept(targets: list[int], drafts: Sequence[int]) -> list[int]:
    """The target's tokens up to and including its first disagreement with the drafts."""
    for position, draft in enumerate(drafts):
        if targets[position] != draft:
            return targets[: position + 1]
    return targets[: len(drafts) + 1]
