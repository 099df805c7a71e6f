"""The router's relay capacity against zero-work fake tiers."""
