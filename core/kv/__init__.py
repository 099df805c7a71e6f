"""KV memory: the block pool (ref counts, prefix cache), the paged cache tensor, the KV-cache
manager that owns both and the CPU swap pool, and the sliding-window paging rule."""
