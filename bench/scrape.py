"""Values from a local pdserve process's Prometheus page: what the cluster benchmarks read of the
workers they start."""

from __future__ import annotations

import urllib.request


def metric_value(port: int, name: str, host: str = "127.0.0.1") -> float:
    """The unlabelled sample `name` on http://HOST:PORT/metrics; KeyError if absent."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)


def metric_samples(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """Every sample on http://HOST:PORT/metrics by its name and labels as written there
    (`name` or `name{label="value"}`)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as page:
        lines = page.read().decode().splitlines()
    samples = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
