"""Speculative decoding: which requests draft (speculator), what drafts (proposer, n-gram),
and how drafts are verified."""
