"""`pdserve selftest`: checks of the GPU path on a machine that has one (not a benchmark)."""
