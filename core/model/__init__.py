"""The model: config, GGUF preparation, our own forward over the paged KV cache, GEMM."""
