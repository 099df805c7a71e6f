"""protos/pdserve/v1."""
