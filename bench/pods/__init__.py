"""Benchmarks of pods on one machine: what a CPU limit gives a worker."""
