"""Fakes only the tests use."""

from pathlib import Path

# A profile measured on 2026-12-01 on another host class (AMD EPYC, the engine's MKL matmuls) and
# before profiles carried a fingerprint: fixed numbers for the tests that need some profile, and
# the wrong one on purpose where a test checks that the online correction fixes it. Never the
# default of anything (pdserve profiles the host it serves on: docs/planning.md).
PROFILE_OTHER_HOST = Path(__file__).with_name("profile_other_host.json")
