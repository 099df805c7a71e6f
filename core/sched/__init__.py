"""Scheduling: which requests run each step with how many tokens, preemption and swap, the
step plan handed to the runner, and the load a worker reports."""
