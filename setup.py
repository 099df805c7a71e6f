"""Build hook only: generate the protobuf / gRPC modules and their mypy stubs at build time.

Everything else about the distribution is in pyproject.toml. The generated files land next to the
.proto files in protos/pdserve/v1/ (gitignored), which is the `pdserve.v1` package both for an
editable install (the package maps onto that folder) and for a wheel (build_py copies the folder
after this hook ran). `-I protos` makes the generated code import `from pdserve.v1 import ...`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_ROOT = Path(__file__).resolve().parent / "protos"
PROTO_PACKAGE_DIR = PROTO_ROOT / "pdserve" / "v1"


def _find_plugin(name: str) -> str:
    # pip's isolated build env puts its scripts on PATH; a plain venv has them next to python.
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        # SystemExit, not an Exception: setuptools' editable build swallows Exceptions raised by
        # a custom build_py and would install without the generated modules.
        raise SystemExit(f"{name} not found: install mypy-protobuf (see [build-system].requires)")
    return found


def generate_protos() -> None:
    """Run grpc_tools.protoc over protos/pdserve/v1/*.proto (python, grpc, mypy stubs)."""
    import grpc_tools
    from grpc_tools import protoc

    well_known_protos = Path(grpc_tools.__file__).resolve().parent / "_proto"
    proto_files = sorted(str(path) for path in PROTO_PACKAGE_DIR.glob("*.proto"))
    if not proto_files:
        raise SystemExit(f"no .proto files in {PROTO_PACKAGE_DIR}")
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known_protos}",
        f"--plugin=protoc-gen-mypy={_find_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_find_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={PROTO_ROOT}",
        f"--grpc_python_out={PROTO_ROOT}",
        f"--mypy_out=quiet:{PROTO_ROOT}",
        f"--mypy_grpc_out=quiet:{PROTO_ROOT}",
        *proto_files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc failed on {', '.join(proto_files)}")


class BuildPyWithProtos(build_py):  # type: ignore[misc]  # setuptools ships no type hints
    """build_py that first generates the protobuf modules (runs for wheels and editables)."""

    def run(self) -> None:
        generate_protos()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
