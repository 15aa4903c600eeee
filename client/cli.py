"""`python -m client generate|chat`: one-shot generation and an interactive chat.

With an API key (`--api-key`, or `$LLM_API_KEY`) it goes through the gateway,
whose ports are then the default URL: `LLM_API_KEY=sk-... python -m client
generate "Hi"` streams from http://127.0.0.1:9000 with the key as a Bearer token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from .config import ENTRY_MODELS, TRANSPORTS, ClientConfig, TimeoutConfig
from .errors import ClientError
from .sync import LLMClient
from .types import GenerationOptions, GenerationResult

DEFAULT_URLS = {"sse": "http://127.0.0.1:8000", "grpc": "127.0.0.1:8001"}
# With an API key the gateway is the one to talk to: Triton takes no keys.
GATEWAY_URLS = {"sse": "http://127.0.0.1:9000", "grpc": "127.0.0.1:9001"}
API_KEY_ENV = "LLM_API_KEY"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    generate = sub.add_parser("generate", help="one prompt -> stdout")
    generate.add_argument("prompt", help="the prompt; '-' reads stdin")
    generate.add_argument("--json", action="store_true", help="print the result object as JSON")
    generate.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    chat = sub.add_parser("chat", help="interactive streaming chat (/reset, /quit)")
    chat.add_argument("--system", default=None, help="system prompt")
    for command in (generate, chat):
        _add_common(command)
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=TRANSPORTS, default="sse")
    parser.add_argument("--model", choices=ENTRY_MODELS, default="ensemble")
    parser.add_argument(
        "--url",
        default=None,
        help="default: http://127.0.0.1:8000 (sse), 127.0.0.1:8001 (grpc); with an API key the gateway's :9000 / :9001",
    )
    # Read from the environment in _config, not as the default here: --help would print it.
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"the gateway's API key (default: ${API_KEY_ENV}); sends the request through the gateway",
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--segment", choices=("token", "sentence", "paragraph"), default=None)
    parser.add_argument("--first-token-timeout", type=float, default=120.0)
    parser.add_argument("--token-timeout", type=float, default=30.0)


def _config(args: argparse.Namespace) -> ClientConfig:
    timeouts = TimeoutConfig(first_token_s=args.first_token_timeout, token_s=args.token_timeout)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    default_url = (GATEWAY_URLS if api_key else DEFAULT_URLS)[args.transport]
    return ClientConfig(
        url=args.url or default_url, transport=args.transport, model=args.model, timeouts=timeouts, api_key=api_key
    )


def _options(args: argparse.Namespace, messages: list[dict[str, str]] | None = None) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop_words=args.stop,
        segment=args.segment,
        messages=messages,
    )


def _timing_line(result: GenerationResult) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    return (
        f"[TTFT {ms(result.ttft_s)} | TPOT {ms(result.tpot_s)} | {result.num_output_tokens} tokens | "
        f"finish {result.finish_reason}]"
    )


def run_generate(args: argparse.Namespace, client: LLMClient, out: TextIO) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    messages = [{"role": "user", "content": prompt}] if args.chat else None
    options = _options(args, messages)
    text_input = "" if messages else prompt
    if args.json:
        result = client.generate(text_input, options)
        out.write(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        events, result = client.stream_with_result(text_input, options)
        for event in events:
            out.write(event.text)
            out.flush()
        out.write("\n")
    return 0 if result.finish_reason != "error" else 1


def run_chat(args: argparse.Namespace, client: LLMClient, out: TextIO, stdin: TextIO) -> int:
    history: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    start = len(history)
    out.write("chat: /reset clears the conversation, /quit leaves\n")
    while True:
        out.write("> ")
        out.flush()
        line = stdin.readline()
        if not line or line.strip() == "/quit":
            return 0
        if line.strip() == "/reset":
            del history[start:]
            out.write("(conversation cleared)\n")
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line.rstrip("\n")})
        try:
            events, result = client.stream_with_result("", _options(args, list(history)))
            for event in events:
                out.write(event.text)
                out.flush()
        except ClientError as exc:
            history.pop()
            out.write(f"\n[error: {exc}]\n")
            continue
        history.append({"role": "assistant", "content": result.text})
        out.write(f"\n{_timing_line(result)}\n")


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, stdin: TextIO = sys.stdin) -> int:
    args = build_parser().parse_args(argv)
    try:
        with LLMClient(_config(args)) as client:
            if args.command == "generate":
                return run_generate(args, client, out)
            return run_chat(args, client, out, stdin)
    except (ClientError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
