"""Serving glue shared by both tiers: engine thread, gRPC server, flags, proto conversion."""
