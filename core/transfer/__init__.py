"""The KV data plane: UCX between tiers (with staging buffers), in-process for tests."""
