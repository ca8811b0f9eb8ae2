"""The one bounded JSON decoder (reward_protocol/bounded_json.py): its limits on their own, then the
same hostile documents sent to every route that reads JSON, answered with the same 4xx."""

from __future__ import annotations

import struct
import time

import orjson
import pytest

from reward_protocol import raw_batch
from reward_protocol.bounded_json import MAX_DEPTH, InvalidJSON, loads_bounded
from tests.helpers.servers import CHAT, InProcessServer, post

DEEP = b"[" * 100_000 + b"]" * 100_000

REFUSED = [
    (DEEP, "deeper than 64"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "deeper than 64"),
    (b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "deeper than 64"),
    (b'["\\\\"' + b"[" * 100 + b"]" * 100 + b"]", "deeper than 64"),  # an escaped backslash ends the string
    (b"[NaN]", "NaN and Infinity"),
    (b"[-Infinity]", "NaN and Infinity"),
    (b"[1e999]", "infinity"),
    (b"[9223372036854775808]", "outside the 64-bit range"),
    (b"[-9223372036854775809]", "outside the 64-bit range"),
    (b"[1" + b"0" * 5000 + b"]", "outside the 64-bit range"),
    (b"{bad}", "not valid JSON"),
    (b"", "not valid JSON"),
]

ACCEPTED = [
    b"[" * MAX_DEPTH + b"]" * MAX_DEPTH,
    b'{"a":' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH,
    b'"' + b"[" * 1000 + b'"',  # brackets inside a string are text
    b'["\\"' + b"[" * 1000 + b'"]',  # so are those after an escaped quote
    b'{"a": "\\u1234[[[["}',
    b"[9223372036854775807, -9223372036854775808]",
    b'["123456789012345678901234567890"]',  # digits in a string
    b"[0.12345678901234567890123, 1.5e-1234567890123456789, 123456789012345678901234.5]",
]


def _id(value) -> str | None:
    return value[:16].decode() if isinstance(value, bytes) else None


@pytest.mark.parametrize("doc, fragment", REFUSED, ids=_id)
def test_refused_with_the_reason(doc, fragment):
    with pytest.raises(InvalidJSON, match=r"^header is not valid JSON") as caught:
        loads_bounded(doc, what="header")
    assert fragment in str(caught.value)


@pytest.mark.parametrize("doc", ACCEPTED, ids=_id)
def test_accepted_as_the_parser_reads_it(doc):
    assert loads_bounded(doc) == orjson.loads(doc)
    assert loads_bounded(doc.decode()) == orjson.loads(doc)


def test_size_limit():
    with pytest.raises(InvalidJSON, match="body of 9 bytes exceeds the limit of 8 bytes"):
        loads_bounded(b"[1,2,3,4]", max_bytes=8)


def test_the_depth_scan_is_flat_and_fast():
    started = time.perf_counter()
    for doc in (DEEP, b"[" * 10_000_000, b'["' + b"[" * 10_000_000 + b'"]'):
        try:
            loads_bounded(doc)
        except InvalidJSON:
            pass
    assert time.perf_counter() - started < 5


@pytest.fixture(scope="module")
def server():
    with InProcessServer() as s:
        yield s


def _raw(header: bytes) -> bytes:
    return raw_batch.MAGIC + struct.pack("<I", len(header)) + header


@pytest.mark.parametrize("doc, fragment", [d for d in REFUSED if d[0]], ids=_id)
def test_every_route_refuses_the_same_document_alike(server, doc, fragment):
    json_type = {"content-type": "application/json"}
    answers = {
        "/score": post(f"{server.url}/score", content=doc, headers=json_type),
        "/score/batch": post(f"{server.url}/score/batch", content=doc, headers=json_type),
        "raw header": post(
            f"{server.url}/score/batch", content=_raw(doc), headers={"content-type": raw_batch.CONTENT_TYPE}
        ),
    }
    for route, r in answers.items():
        assert r.status_code == 422, (route, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request" and fragment in error["message"], (route, error)
    assert "raw batch header is not valid JSON" in answers["raw header"].json()["error"]["message"]
    chat = post(f"{server.url}{CHAT}", content=doc, headers=json_type)  # as vllm serve: 400 under /v1
    assert chat.status_code == 400 and fragment in chat.json()["error"]["message"], chat.text
    assert post(f"{server.url}/score", json={"task_text": "t", "frames": None}).status_code == 422  # still serving
