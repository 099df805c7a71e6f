"""pdserve side by side with llama.cpp on the same host and workload."""
