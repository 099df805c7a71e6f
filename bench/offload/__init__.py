"""`pdserve bench offload`: KV offload tiers on multi-turn traffic (docs/kv_offload.md)."""
