"""`python -m reward_server`: flags (seed-compatible names) and YAML presets -> a running server.

Nothing heavy is imported before the flags are read: `--help` lists backends and engines
without touching vLLM, torch or transformers, and `--gpu-ids` sets CUDA_VISIBLE_DEVICES
before anything can initialise CUDA.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import types
import typing
from typing import Any

from pydantic import ValidationError

from reward_server.engines import ENGINES
from reward_server.profiles import ALIASES, PROFILES, UnknownBackend, canonical_backend
from reward_server.settings import ServerSettings, load_yaml

logger = logging.getLogger("reward_server")

_FLAG_NAMES = {"video_roots": "--video-root"}


def _epilog() -> str:
    lines = ["backends (--backend):"]
    for name, (_, _, desc) in PROFILES.items():
        aliases = [a for a, target in ALIASES.items() if target == name]
        lines.append(f"  {name:<18} {desc}" + (f" (aliases: {', '.join(aliases)})" if aliases else ""))
    lines.append("engines (--engine):")
    for name, (_, _, desc) in ENGINES.items():
        lines.append(f"  {name:<18} {desc}")
    lines.append("presets: --config configs/server/<name>.yaml (flags given on the command line win)")
    return "\n".join(lines)


def _scalar_type(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _scalar_type(args[0])
    if origin is typing.Literal:
        return str
    return annotation if annotation in (int, float, str) else str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reward_server",
        description="Serve a vision-language judge of robot episodes over HTTP (POST /score, GET /health).",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="YAML preset of these settings (keys as flag names)")
    for name, field in ServerSettings.model_fields.items():
        flag = _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        default = field.default_factory() if field.default_factory else field.default
        help_text = f"{field.description or ''} (default: {default})".strip()
        annotation = field.annotation
        if annotation is bool or annotation == bool | None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif typing.get_origin(annotation) is list:
            metavar = "DIR" if name == "video_roots" else "KEY=VALUE"
            parser.add_argument(flag, dest=name, action="append", metavar=metavar, help=help_text)
        else:
            choices = None
            literal = [a for a in typing.get_args(annotation) if typing.get_origin(a) is typing.Literal]
            if typing.get_origin(annotation) is typing.Literal:
                choices = list(typing.get_args(annotation))
            elif literal:
                choices = list(typing.get_args(literal[0]))
            parser.add_argument(flag, dest=name, type=_scalar_type(annotation), choices=choices, help=help_text)
    return parser


def parse_settings(argv: list[str] | None = None) -> ServerSettings:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    merged: dict[str, Any] = {}
    config = args.pop("config", None)
    if config:
        try:
            merged.update(load_yaml(config))
        except (OSError, ValueError) as exc:
            parser.error(f"--config {config}: {exc}")
    merged.update(args)
    try:
        settings = ServerSettings(**merged)
        canonical_backend(settings.backend)
        settings.engine_options()
    except ValidationError as exc:
        problems = "; ".join(
            (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        )
        parser.error(problems)
    except (UnknownBackend, ValueError) as exc:  # unknown backend, malformed --engine-option
        parser.error(str(exc))
    return settings


def serve(settings: ServerSettings) -> int:
    """Run the server until it is stopped; returns the process exit code."""
    import uvicorn

    from reward_server.bootstrap import build_service
    from reward_server.http.app import build_app
    from reward_server.http.connections import DrainingServer, server_config

    exit_code = 0
    server: uvicorn.Server | None = None

    def on_failure(detail: str) -> None:
        nonlocal exit_code
        exit_code = 1
        if server is not None:
            server.should_exit = True  # a supervisor restarts a process that exits non-zero

    service = build_service(settings, on_failure, owns_process=True)
    server = DrainingServer(server_config(build_app(service), settings), service, settings.shutdown_timeout_s)
    server.run()
    return exit_code


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of resource names to amounts")
    return value


def serve_ray(argv: list[str]) -> int:
    """`python -m reward_server serve-ray [--num-replicas N ...] <server flags>`."""
    parser = argparse.ArgumentParser(prog="python -m reward_server serve-ray", add_help=False)
    parser.add_argument("--num-replicas", type=int, default=1)
    parser.add_argument("--gpus-per-replica", type=float, default=1.0)
    parser.add_argument("--cpus-per-replica", type=float, default=1.0)
    parser.add_argument("--address", default=None, help="Ray cluster address ('auto': the running cluster)")
    parser.add_argument(
        "--resources-per-replica",
        type=_json_object,
        default={},
        help="custom Ray resources, e.g. '{\"reward_slot\": 1}'",
    )
    parser.add_argument("--max-replicas-per-node", type=int, default=None)
    parser.add_argument("--max-ongoing-requests", type=int, default=None, help="per replica (default: max(64, queue))")
    parser.add_argument("--proxy-location", choices=["EveryNode", "HeadOnly", "Disabled"], default="EveryNode")
    ours, rest = parser.parse_known_args(argv)
    settings = parse_settings(rest)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from reward_server.ray_serve import RayServeOptions, serve_replicas

    return serve_replicas(settings, RayServeOptions(**vars(ours)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-ray"]:
        return serve_ray(argv[1:])
    settings = parse_settings(argv)
    if settings.gpu_ids is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = settings.gpu_ids
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return serve(settings)
