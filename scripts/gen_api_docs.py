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
`reward_protocol/score.py`, shared by the server and the client.

Errors have the shape `{"error": {"type": ..., "message": ...}}`; under `/v1` (OpenAI's chat
dialect, models in `reward_protocol/chat.py`) they have OpenAI's shape, `{"error":
{"message", "type", "param", "code"}}`, with the same statuses, `code` holding the type below
and `param` the request field at fault, except that a body or field that fails validation is a
400 there (`bad_request`, `param` naming the field), as `vllm serve` and OpenAI answer it. In a batch, an item that fails has the same `type` in
its own `error`, and the other items are scored: in a JSON batch, an item that fails validation
too (`invalid_request`, the message naming `requests.<i>.<field>`); a body that is not a batch
(no `requests` list, too many items), and a raw batch's header, fail as a whole. Every 503 carries `Retry-After`.

Every error also says `retryable` (the column below): `true` when the same request (or batch
item) sent again can succeed (the server was full, loading or draining, the engine failed that
one request, the answer ran out of time), `false` when the request itself must change or the
server failed (500). In a `/score/batch` answer (JSON or raw body), `reward_client.client` sends
the retryable items again, alone, with the same backoff and overall deadline as a whole request,
and returns one entry per episode in order; the RLinf hook sees their scores. Past the deadline
an item keeps its last error.

The client believes no answer that cannot be right. It reads answers strictly (a `score` is a
JSON number, not `true` or `"0.7"`; an `index` an integer, not `"1"`, `true` or `1.0`) and then
wants one item per episode with indices exactly 0..n-1, each item a `response` or an `error`,
every `score` and `progress` point finite in [0, 1] or null, `progress` of exactly the K points
the request asked for (`progress_points`; none, or one point, for K = 1) with `score` its last
point, and a `parse_status` that agrees with the score (a failed parse carries no score; a null
score comes with a failed parse). Anything else is a protocol error, counted
(`RewardClient.stats()`, the hook's `env/vlm_protocol_errors`) and retried within the deadline,
never a reward.

Request header `X-Reward-Deadline-S` (optional, on every POST): the seconds the client still waits
for this answer. The server ends the request there, capped by `--request-timeout-s` (504, or in a
batch the unfinished items' retryable `deadline_exceeded`, naming which bound it was); a value
that is not a positive number is a 400. `reward_client.client` sends each attempt's bound, a
little less so the answer still arrives.

`GET /health` says the server's limits (`limits`: largest JSON and raw batch bodies, episodes per
batch, `--request-timeout-s`); `reward_client.client` cuts a batch into requests within them on
every transport, and halves a batch still refused as too large (413: a server that does not say
its limits, or a proxy in front of it). Limits that cannot be meant (a body under 16 KiB, no
episodes per request) are ignored with a warning; at most 16 requests of a call are in flight.
The client reads no answer past what its request can need (`reward_client/bounded_answers.py`,
on the wire and after gzip or deflate): a larger one is a protocol error, retried.

Frames are uint8 on the wire (`frames.data_b64`, raw batch payloads). The client converts float
frames in [0, 1] as round(x * 255) (`reward_protocol.frames.as_uint8`) and refuses other dtypes;
a frames buffer or raw payload of any other length than its shapes need is refused (422), and
the error names wider pixels when the length is 2, 4 or 8 times what the shapes need.
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


def error_table() -> list[str]:
    """The error types (reward_server/errors.py's one table), by status."""
    from reward_server.errors import ERROR_TYPES

    lines = ["## Error types", "", "| status | `type` | retryable | when |", "|---|---|---|---|"]
    for e in sorted(ERROR_TYPES, key=lambda e: e.status):
        retry = "yes" if e.retryable else "no"
        lines.append(f"| {e.status} | `{e.type}` | {retry} | {e.when.replace('|', chr(92) + '|')} |")
    return [*lines, ""]


def render(openapi: dict) -> str:
    components = openapi["components"]["schemas"]
    lines = [INTRO, *error_table(), "Every `GET` route also answers `HEAD` (the same status and headers, no body).", ""]
    lines += ["## Routes", ""]
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
