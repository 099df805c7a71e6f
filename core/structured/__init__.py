"""Structured outputs: what a request's output must follow (params), compiled into a grammar whose
token mask is applied to the logits before sampling (grammar, llguidance underneath)."""
