"""The .proto files: a doc comment on everything, prefixed enum values, the service shapes the
design needs, and generated modules + mypy stubs present and in step with the .proto files."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

PROTO_ROOT = Path(__file__).parents[2] / "protos"
PROTO_DIR = PROTO_ROOT / "pdserve" / "v1"
PROTO_FILES = sorted(PROTO_DIR.glob("*.proto"))
MODULES = [path.stem for path in PROTO_FILES]

# FileDescriptorProto / DescriptorProto / EnumDescriptorProto / ServiceDescriptorProto field numbers
# that make up a SourceCodeInfo location path.
MESSAGE, ENUM, SERVICE = 4, 5, 6
FIELD, NESTED_MESSAGE, NESTED_ENUM, ONEOF = 2, 3, 4, 8
ENUM_VALUE, METHOD = 2, 2


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorSet:
    """The .proto files parsed by protoc itself, with their comments (source info)."""
    out = tmp_path_factory.mktemp("protos") / "set.pb"
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", "--include_source_info"]
    assert protoc.main([*args, f"--descriptor_set_out={out}", *map(str, PROTO_FILES)]) == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _documented_elements(
    proto: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, source path) of every message, field, oneof, enum, enum value, service, rpc."""
    for i, message in enumerate(proto.message_type):
        yield from _message_elements(message, (MESSAGE, i), message.name)
    for i, enum in enumerate(proto.enum_type):
        yield from _enum_elements(enum, (ENUM, i), enum.name)
    for i, service in enumerate(proto.service):
        yield f"service {service.name}", (SERVICE, i)
        for j, method in enumerate(service.method):
            yield f"rpc {service.name}.{method.name}", (SERVICE, i, METHOD, j)


def _message_elements(
    message: descriptor_pb2.DescriptorProto, path: tuple[int, ...], name: str
) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"message {name}", path
    for j, field in enumerate(message.field):
        yield f"field {name}.{field.name}", (*path, FIELD, j)
    for j, oneof in enumerate(message.oneof_decl):
        if not oneof.name.startswith("_"):  # synthetic oneofs of proto3 `optional` fields
            yield f"oneof {name}.{oneof.name}", (*path, ONEOF, j)
    for j, nested in enumerate(message.nested_type):
        yield from _message_elements(nested, (*path, NESTED_MESSAGE, j), f"{name}.{nested.name}")
    for j, enum in enumerate(message.enum_type):
        yield from _enum_elements(enum, (*path, NESTED_ENUM, j), f"{name}.{enum.name}")


def _enum_elements(
    enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], name: str
) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"enum {name}", path
    for j, value in enumerate(enum.value):
        yield f"enum value {name}.{value.name}", (*path, ENUM_VALUE, j)


def test_every_element_has_a_doc_comment(descriptor_set: descriptor_pb2.FileDescriptorSet) -> None:
    undocumented = []
    checked = 0
    for proto in descriptor_set.file:
        comments = {
            tuple(loc.path): loc.leading_comments for loc in proto.source_code_info.location
        }
        for name, path in _documented_elements(proto):
            checked += 1
            if not comments.get(path, "").strip():
                undocumented.append(f"{proto.name}: {name}")
    assert checked > 100  # the walk really covered the files
    assert undocumented == []


def test_files_package_and_enum_prefixes(descriptor_set: descriptor_pb2.FileDescriptorSet) -> None:
    names = sorted(proto.name for proto in descriptor_set.file)
    assert names == [f"pdserve/v1/{n}.proto" for n in ("common", "decode", "generation", "prefill")]
    for proto in descriptor_set.file:
        assert proto.package == "pdserve.v1" and proto.syntax == "proto3"
        for enum in proto.enum_type:
            prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_")
            assert all(value.name.startswith(prefix + "_") for value in enum.value), enum.name
            assert enum.value[0].name == f"{prefix}_UNSPECIFIED" and enum.value[0].number == 0


@pytest.mark.parametrize(
    ("service", "methods"),
    [
        ("Generation", {"Generate": False, "GenerateStream": True, "Info": False}),
        ("Prefill", {"Prefill": False, "Redirect": False, "Load": False}),
        (
            "Decode",
            {
                "Reserve": False,
                "Generate": True,
                "GenerateLocal": True,
                "Release": False,
                "Abort": False,
                "Load": False,
                "Suspend": False,
                "Migrate": False,
                "Multiplex": True,
            },
        ),
    ],
)
def test_service_shapes(service: str, methods: dict[str, bool]) -> None:
    module = importlib.import_module(f"pdserve.v1.{service.lower()}_pb2")
    descriptor = module.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"pdserve.v1.{service}"
    found = {m.name: m.server_streaming for m in descriptor.methods}
    assert found == methods
    # The router's one stream per decode worker is the only call a client streams into.
    client_streaming = {m.name for m in descriptor.methods if m.client_streaming}
    assert client_streaming == ({"Multiplex"} if service == "Decode" else set())


@pytest.mark.parametrize("module", MODULES)
def test_generated_modules_and_stubs_exist(module: str) -> None:
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
        assert (PROTO_DIR / f"{module}{suffix}").is_file(), f"{module}{suffix}: run ./setup.sh"
    importlib.import_module(f"pdserve.v1.{module}_pb2_grpc")


@pytest.mark.parametrize("module", MODULES)
def test_generated_code_matches_the_proto_file(
    module: str, descriptor_set: descriptor_pb2.FileDescriptorSet
) -> None:
    """Stale generated code (a .proto edited without re-running ./setup.sh) fails here."""
    compiled = next(p for p in descriptor_set.file if p.name == f"pdserve/v1/{module}.proto")
    compiled.ClearField("source_code_info")
    _clear_json_names(compiled.message_type)  # protoc's Python output leaves them out
    generated = importlib.import_module(f"pdserve.v1.{module}_pb2").DESCRIPTOR
    assert descriptor_pb2.FileDescriptorProto.FromString(generated.serialized_pb) == compiled


def _clear_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _clear_json_names(message.nested_type)


def test_stub_types_use_the_package_import_path() -> None:
    stub = (PROTO_DIR / "generation_pb2_grpc.pyi").read_text()
    assert "from pdserve.v1 import generation_pb2" in stub
    assert "class GenerationAsyncStub" in stub and "class GenerationServicer" in stub
