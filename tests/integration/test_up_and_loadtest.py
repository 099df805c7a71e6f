"""The README's main command (`pdserve up`) under the project's load runner, then Ctrl-C."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from .pdserve_up import PdserveUp

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_loadtest_runner_against_pdserve_up(model_dir: Path, tmp_path: Path) -> None:
    up = PdserveUp(model_dir, tmp_path / "logs")
    try:
        up.wait_ready()
        report_path = tmp_path / "report.json"
        runner = [
            sys.executable,
            "-m",
            "pdserve",
            "loadtest",
            str(REPO / "loadtest" / "stream_concurrency.json"),
            "--host",
            up.address,
            "-c",
            "4",
            "-n",
            "12",
            "-q",
            "--output",
            str(report_path),
        ]
        load = subprocess.run(runner, capture_output=True, text=True, timeout=300)
        assert load.returncode == 0, load.stderr
        report = json.loads(report_path.read_text())
        assert report["count"] == 12
        assert report["statusCodeDistribution"] == {"OK": 12}
        assert not report["errorDistribution"]
        assert report["generation"]["outputTokens"] == 12 * 32  # ignore_eos, max_tokens 32
        _chat_as_readme_shows(up.http_base_url)
    finally:
        returncode, output = up.stop()
    assert returncode == 0, output


def _chat_as_readme_shows(base_url: str) -> None:
    """README's `openai` example against `pdserve up`'s HTTP door."""
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="smollm2-135m-instruct",
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "Tell me about Paris"}],
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text.strip()
