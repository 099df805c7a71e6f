"""Prompts the router sent one worker to prefill that its load reports may not show yet.

The adaptive placement counts a prompt on its worker when it decides, and the worker's next load
report used to clear every count. A remote prompt's Prefill call starts only after decode's
Reserve returns (half a decode step and more), so a report answered in between cleared a prompt
the worker had not received, and the next placement saw an idle prefill worker where a long
prompt was about to be computed. Here a report clears a prompt only once its call started before
that report's poll did; a prompt whose call never starts is forgotten by its dispatch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class _SentPrompt:
    tokens: int
    # The worker's poll count when the prompt's call started; None while it has not.
    call_started_at_poll: int | None = None


class SentPrompts:
    """One worker's prompts sent since the load report that will first show them."""

    def __init__(self) -> None:
        self._prompts: dict[str, _SentPrompt] = {}
        self._polls_started = 0

    @property
    def count(self) -> int:
        return len(self._prompts)

    @property
    def tokens(self) -> int:
        return sum(prompt.tokens for prompt in self._prompts.values())

    def decided(self, request_id: str, tokens: int) -> None:
        """The placement chose this worker to prefill the request's `tokens`."""
        self._prompts[request_id] = _SentPrompt(tokens)

    def call_started(self, request_id: str) -> None:
        """The call carrying the prompt is on its way (a no-op for one not counted here)."""
        prompt = self._prompts.get(request_id)
        if prompt is not None and prompt.call_started_at_poll is None:
            self._prompts[request_id] = _SentPrompt(prompt.tokens, self._polls_started)

    def forget(self, request_id: str) -> None:
        """Done with, or never sent: whatever a report shows of it, it is not counted here."""
        self._prompts.pop(request_id, None)

    def poll_started(self) -> int:
        """A Load poll of the worker starts; pass the returned number to `reported`."""
        self._polls_started += 1
        return self._polls_started

    def reported(self, poll: int) -> None:
        """The report of `poll` arrived: it shows every prompt whose call started before."""
        self._prompts = {
            request_id: prompt
            for request_id, prompt in self._prompts.items()
            if prompt.call_started_at_poll is None or prompt.call_started_at_poll >= poll
        }
