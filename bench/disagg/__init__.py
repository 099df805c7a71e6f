"""Colocated vs disaggregated serving on the same cores, and the KV transfer share of TTFT."""
