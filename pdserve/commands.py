"""Lazy command tables, one shape at every level (`pdserve X`, `pdserve bench Y`).

A table maps each name to (module, help). Every name gets a subparser, so `--help` lists them
all, but only the chosen name's module is imported: `pdserve generate` (a gRPC client) and
`pdserve bench --help` do not pay for torch. A module either is a command (`add_arguments(parser)`
and `run(args) -> int`) or holds a table of its own (`GROUP`, a `CommandGroup`) plus `run`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast


class Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class CommandGroup:
    dest: str  # the attribute of the parsed args that names the chosen command
    table: Mapping[str, tuple[str, str]]  # name -> (module, help)

    def load(self, name: str) -> Command:
        return cast(Command, importlib.import_module(self.table[name][0]))

    def add_to(self, parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
        """A subparser per name; the arguments of the one `argv` names (its first word that is
        not an option), imported now, and so on down for a group of groups."""
        subparsers = parser.add_subparsers(dest=self.dest, required=True, metavar=self.dest.upper())
        words = [index for index, word in enumerate(argv) if not word.startswith("-")]
        chosen = argv[words[0]] if words else None
        for name, (module_name, help_text) in self.table.items():
            sub = subparsers.add_parser(name, help=help_text, description=help_text)
            if name != chosen:
                continue
            module = importlib.import_module(module_name)
            group = getattr(module, "GROUP", None)
            if isinstance(group, CommandGroup):
                group.add_to(sub, argv[words[0] + 1 :])
            else:
                cast(Command, module).add_arguments(sub)
