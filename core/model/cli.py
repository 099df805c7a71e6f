"""`pdserve model prepare|info`: convert the embedded model once; show what a folder holds."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from pdserve.core.model.config import load_model_config
from pdserve.core.model.prepare import convert_gguf, default_gguf_path
from pdserve.core.model.source import resolve_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["prepare", "info"])
    parser.add_argument("--output", type=Path, default=None, help="prepare: write the folder here")
    parser.add_argument("--model-cache", type=Path, default=None, help="prepare: cache folder")
    parser.add_argument("--model", default=None, help="info: a local HF model folder")


def run(args: argparse.Namespace) -> int:
    if args.action == "prepare":
        if args.output is not None:
            if not (args.output / "config.json").exists():
                convert_gguf(default_gguf_path(), args.output)
            folder = args.output
        else:
            folder = resolve_model(None, args.model_cache)
        print(folder)
        return 0
    config = load_model_config(resolve_model(args.model, args.model_cache))
    for key, value in asdict(config).items():
        print(f"{key}: {value}")
    return 0
