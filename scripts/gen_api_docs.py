#!/usr/bin/env python3
"""Write docs/api.md (the wire contract) from the server's OpenAPI schema.

    python scripts/gen_api_docs.py [--check]

--check exits 1 if docs/api.md differs from what the schema gives (tests run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api.md"

INTRO = """# Reward server API

Generated from the server's OpenAPI schema by `scripts/gen_api_docs.py`; do not edit by hand.
The schema itself is served at `GET /openapi.json` (and browsable at `/docs`). The models live in
`reward_client/protocol.py`, shared by the server and the client.

Errors have the shape `{"error": {"type": ..., "message": ...}}`; under `/v1` (OpenAI's chat
dialect, models in `reward_client/openai_chat.py`) they have OpenAI's shape, `{"error":
{"message", "type", "param", "code"}}`, with the same statuses, `code` holding the type above
and `param` the request field at fault:

| status | when |
|---|---|
| 400 | the video cannot be used (not a container the server reads, not a regular file, undecodable), unknown backend, an option the backend or this deployment does not support, `max_tokens` over `--max-tokens-limit`; under `/v1`: an image that cannot be used (not a JPEG, PNG or WebP data URL or file under `--video-root`; http(s) URLs are never fetched), more images than `--max-images-per-request`, `stream: true`, `n` other than 1 |
| 401 | `--api-key` is set and the request has no or a wrong `Authorization: Bearer` header |
| 403 | `video_path` outside the server's `--video-root` directories |
| 404 | no such route (`not_found`); under `/v1` also `model` naming a model this server does not serve (`model_not_found`; `GET /v1/models` lists it) |
| 405 | a route asked with a method it does not take (`method_not_allowed`; `Allow` names those it does) |
| 408 | the body stalled for `--body-timeout-s` (or the request head for `--header-timeout-s`) |
| 411 | a raw batch body without `Content-Length` |
| 413 | body larger than `--max-body-mb` or than `--max-inflight-mb` allows at all; a video or image over a decode budget (`--max-video-frames`, `--max-frame-pixels`, checked from the header before decoding, `--decode-timeout-s`, `--decode-memory-mb`); more episodes than `--max-queue` in one request |
| 415 | content type other than `application/json` (or `application/x-reward-batch` on `/score/batch`) |
| 422 | malformed JSON, raw batch or a field that fails validation (the message names it) |
| 431 | request head larger than `--max-header-kb` |
| 499 | (logged only) the client disconnected; its engine work was aborted |
| 503 | loading, draining, failed, or full: episodes and chat requests together (`--max-queue`; `/metrics` counts them apart: `reward_episodes_in_progress`, `reward_chat_in_progress`) or body bytes (`--max-inflight-mb`) in progress (`Retry-After` says when to retry) |
| 504 | the request took longer than `--request-timeout-s` (in a batch: that item's error) |
| 500 | an internal error (details only in the server log) |
"""


def _type(schema: dict, components: dict) -> str:
    if "$ref" in schema:
        return f"[{schema['$ref'].rsplit('/', 1)[-1]}](#{schema['$ref'].rsplit('/', 1)[-1].lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s, components) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}), components)}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    return schema.get("type", "any")


def _limits(schema: dict) -> str:
    keys = {
        "minimum": ">=",
        "maximum": "<=",
        "exclusiveMinimum": ">",
        "exclusiveMaximum": "<",
        "minLength": "min length",
        "maxLength": "max length",
        "minItems": "min items",
        "maxItems": "max items",
    }
    parts = [f"{label} {schema[k]}" for k, label in keys.items() if k in schema]
    for sub in schema.get("anyOf", []):
        parts += [f"{label} {sub[k]}" for k, label in keys.items() if k in sub]
    return ", ".join(parts)


def render(openapi: dict) -> str:
    components = openapi["components"]["schemas"]
    lines = [INTRO, "## Routes", ""]
    for path, methods in openapi["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            ok = op.get("responses", {}).get("200", {}).get("content", {}).get("application/json", {}).get("schema")
            lines.append(f"### `{method.upper()} {path}`")
            lines.append("")
            if op.get("description"):
                lines += [op["description"].strip(), ""]
            if body:
                lines.append(f"Body: {_type(body, components)}")
            if ok:
                lines.append(f"Answer (200): {_type(ok, components)}")
            codes = ", ".join(sorted(c for c in op.get("responses", {}) if c != "200"))
            if codes:
                lines.append(f"Other statuses: {codes}")
            lines.append("")
    lines += ["## Models", ""]
    for name in sorted(components):
        schema = components[name]
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [" ".join(schema["description"].split()), ""]
        props = schema.get("properties")
        if props:
            required = set(schema.get("required", []))
            lines += ["| field | type | required | default | limits | description |", "|---|---|---|---|---|---|"]
            for field, spec in props.items():
                default = json.dumps(spec["default"]) if "default" in spec else ""
                desc = " ".join(spec.get("description", "").split()).replace("|", "\\|")
                lines.append(
                    f"| `{field}` | {_type(spec, components)} | {'yes' if field in required else ''} "
                    f"| {default} | {_limits(spec)} | {desc} |"
                )
        elif "enum" in schema:
            lines.append("Values: " + ", ".join(f"`{v}`" for v in schema["enum"]))
        lines.append("")
    return "\n".join(lines)


def openapi_schema() -> dict:
    """The schema of the app the server builds (on the fake engine: no model is loaded)."""
    from reward_server.bootstrap import build_app_from_settings
    from reward_server.settings import ServerSettings

    return build_app_from_settings(ServerSettings(engine="fake", decode_workers=1)).openapi()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render(openapi_schema())
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
