"""Micro-benchmarks of one mechanism each: attention, KV transfer, prefix cache, int8 KV,
precisions, the CPU matmul backend."""
