"""decode_service."""
