"""prefill_service."""
