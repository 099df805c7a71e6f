"""A profile knows the host it was measured on, and loading it on another one warns, once."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from pdserve.costmodel.host import REPROFILE_HINT, HostFingerprint, this_host
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile, load_profile

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx fma f16c avx2 bmi2 sha_ni

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx fma f16c avx2 bmi2 sha_ni
"""
HOST_LOGGER = "pdserve.costmodel.host"


def _profile(host: HostFingerprint | None) -> Profile:
    blocks = BlockCosts(1, 0.0, 0.0, 0.0, 1e9)
    return Profile(CostModel((0.01, 0.0, 0.0, 0.0, 0.0)), blocks, block_size=16, host=host)


def test_the_fingerprint_names_the_cpu_and_the_kernel_relevant_isa(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    host = this_host(cpuinfo)
    assert host.cpu_model == "AMD EPYC 7B13"
    assert host.isa_flags == ("avx", "avx2", "f16c", "fma")  # sorted, no unrelated flags
    assert host.logical_cpus >= 1


def test_without_cpuinfo_the_platform_names_the_cpu(tmp_path: Path) -> None:
    host = this_host(tmp_path / "missing")
    assert host.cpu_model and host.isa_flags == ()


def test_a_profile_of_this_host_loads_without_a_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "profile.json"
    _profile(this_host()).save(path)
    with caplog.at_level(logging.WARNING, HOST_LOGGER):
        assert load_profile(path).host == this_host()
    assert not caplog.records


def test_a_profile_of_another_host_warns_once_naming_what_differs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "profile.json"
    elsewhere = dataclasses.replace(this_host(), cpu_model="Intel Xeon 8481C", logical_cpus=176)
    _profile(elsewhere).save(path)
    with caplog.at_level(logging.WARNING, HOST_LOGGER):
        for _ in range(3):
            assert load_profile(path).host == elsewhere
    (record,) = caplog.records
    message = record.getMessage()
    assert "PROFILE MISMATCH" in message and str(path) in message
    assert "cpu_model" in message and "Intel Xeon 8481C" in message and "logical_cpus" in message
    assert "isa_flags" not in message  # only what differs
    assert REPROFILE_HINT in message


def test_a_profile_without_a_fingerprint_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "old-profile.json"
    _profile(None).save(path)
    with caplog.at_level(logging.WARNING, HOST_LOGGER):
        assert load_profile(path).host is None
    (record,) = caplog.records
    assert "says nothing of the host" in record.getMessage()
