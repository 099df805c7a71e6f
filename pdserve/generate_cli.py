"""`pdserve generate`: a prompt in, text out — through the router, or in-process with --local."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import grpc

from pdserve.client import DEFAULT_TARGET, GenerationClient, SamplingParams, build_request


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text (with --chat: the user's message)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message through the model's chat template",
    )
    parser.add_argument("--address", default=DEFAULT_TARGET, help="router host:port")
    parser.add_argument("--stream", action="store_true", help="print tokens as they come")
    parser.add_argument("--local", action="store_true", help="run the engine in this process")
    parser.add_argument(
        "--model",
        default=None,
        help="local HF model folder (--local runs it, --chat uses its "
        "chat template; default: the embedded SmolLM2)",
    )
    parser.add_argument(
        "--model-cache", type=Path, default=None, help="where the default is prepared"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    parser.add_argument(
        "--tls-ca", type=Path, help="PEM CA that signed the router's certificate (TLS on)"
    )
    parser.add_argument("--tls-cert", type=Path, help="PEM client certificate (mTLS)")
    parser.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")


def run(args: argparse.Namespace) -> int:
    if args.chat:
        args.prompt = _chat_prompt(args)
    if args.local:
        return _run_local(args)
    try:
        asyncio.run(_run_remote(args))
    except grpc.aio.AioRpcError as error:
        print(f"\nerror: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as error:  # bad TLS flags or unreadable PEM files
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


async def _run_remote(args: argparse.Namespace) -> None:
    sampling = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        stop=args.stop,
    )
    if args.seed is not None:
        sampling.seed = args.seed
    request = build_request(args.prompt, sampling=sampling, priority=args.priority)
    async with GenerationClient.connect(args.address, _credentials(args)) as client:
        if args.stream:
            async for chunk in client.generate_stream(request, timeout=args.timeout):
                print(chunk.text, end="", flush=True)
            print()
        else:
            reply = await client.generate(request, timeout=args.timeout)
            print(reply.text)


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS towards the router when --tls-ca is given (and mTLS with --tls-cert/--tls-key)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key: set both or neither")
    if args.tls_ca is None:
        if args.tls_cert is not None:
            raise ValueError("--tls-cert: needs --tls-ca (the CA that signed the router)")
        return None
    return grpc.ssl_channel_credentials(
        args.tls_ca.read_bytes(),
        args.tls_key.read_bytes() if args.tls_key is not None else None,
        args.tls_cert.read_bytes() if args.tls_cert is not None else None,
    )


def _chat_prompt(args: argparse.Namespace) -> str:
    """The prompt as the model's chat template renders one user turn (as /v1/chat/completions
    does): the tokenizer comes from the model folder, the same one the router loads."""
    from pdserve.core.model.source import resolve_model
    from pdserve.core.text.chat import ChatMessage, chat_prompt
    from pdserve.core.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(args.model, args.model_cache))
    return chat_prompt(tokenizer, [ChatMessage("user", args.prompt)])


def _run_local(args: argparse.Namespace) -> int:
    from pdserve.core.llm import LLM
    from pdserve.core.sampling_params import InvalidRequestError
    from pdserve.core.sampling_params import SamplingParams as EngineSamplingParams

    try:
        params = EngineSamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=tuple(args.stop),
            priority=args.priority,
        )
        llm = LLM(args.model)
        llm.engine.add_request(args.prompt, params)
    except InvalidRequestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for delta in llm.stream():
        print(delta.text, end="", flush=True)
    print()
    return 0
