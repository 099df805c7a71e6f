"""Fakes only the tests use."""
