"""Fakes shared by the tests, the benchmarks and the selftest (never used in serving)."""
