"""Which prompts sent to a worker its load report clears (router/sent_prompts.py)."""

from __future__ import annotations

from pdserve.router.sent_prompts import SentPrompts


def test_a_report_clears_only_calls_started_before_its_poll() -> None:
    sent = SentPrompts()
    sent.decided("before", 100)
    sent.call_started("before")
    sent.decided("during", 200)
    sent.decided("unsent", 400)
    poll = sent.poll_started()
    sent.call_started("during")  # the poll may have been answered before this call arrived
    sent.reported(poll)
    assert (sent.count, sent.tokens) == (2, 600)
    sent.reported(sent.poll_started())
    assert (sent.count, sent.tokens) == (1, 400)
    sent.forget("unsent")  # its dispatch failed before the call
    assert sent.count == 0


def test_a_prompt_counted_twice_is_one_prompt() -> None:
    """A request placed again (a retry, a migration) replaces its earlier count."""
    sent = SentPrompts()
    sent.decided("r", 100)
    sent.decided("r", 150)
    assert (sent.count, sent.tokens) == (1, 150)
