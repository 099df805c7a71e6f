"""Offline throughput of the engine core: workloads, engines, reports, the step profile."""
