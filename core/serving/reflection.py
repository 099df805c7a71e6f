"""Server reflection that also answers for method names.

The reflection protocol lets a client ask for the file that defines `package.Service.Method`
(`file_containing_symbol`), and ghz asks exactly that for its `call`. grpcio's reflection servicer
hands the name to the protobuf descriptor pool, and the pool (upb, protobuf's default runtime)
finds messages, fields, enums and services but not methods: ghz got NOT_FOUND ("Symbol not
found") where grpcurl, which asks for services, worked. The pool below resolves a method to its
service's file and leaves everything else to the real pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection

SERVICE_NAME = reflection.SERVICE_NAME


class MethodResolvingPool:
    """A descriptor pool (protobuf's default unless given) whose `FindFileContainingSymbol` also
    takes `package.Service.Method`; every other lookup goes to that pool unchanged."""

    def __init__(self, pool: descriptor_pool.DescriptorPool | None = None) -> None:
        self._pool = pool if pool is not None else descriptor_pool.Default()

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:  # the pool's own name
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            service = self._pool.FindServiceByName(service_name)  # KeyError: not found either
            if method not in service.methods_by_name:
                raise
            return service.file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Reflection for these services (and reflection itself) on `server`, method names included."""
    reflection.enable_server_reflection(
        [*service_names, SERVICE_NAME], server, pool=MethodResolvingPool()
    )
