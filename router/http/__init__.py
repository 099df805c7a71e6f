"""The OpenAI-compatible HTTP door of the router (same process and event loop as gRPC)."""
