"""A faulty reward server or proxy on 127.0.0.1: a real HTTP server whose first answers are wrong
in a named way (`FAULTS`), then right. It reads what each request asked (the episodes of a JSON or
raw batch, each one's progress_points), so its right answers carry exactly the K points asked
for, and its wrong ones can be wrong about that too."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from reward_protocol import raw_batch

GOOD = 0.42  # every right answer's score (a curve rises to it)


def response(score, progress=None, parse_status: str = "ok") -> dict:
    return {
        "score": score,
        "model_output": "",
        "backend": "faulty",
        "parse_status": parse_status,
        "score_mode": "unit",
        "nframes": 2,
        "progress": progress,
    }


def curve(points: int) -> list[float] | None:
    """The right curve for K points: rising evenly to GOOD (none for one score)."""
    return None if points == 1 else [round(GOOD * (k + 1) / points, 6) for k in range(points)]


def good(points: list[int]) -> list[dict]:
    return [{"index": i, "response": response(GOOD, curve(k))} for i, k in enumerate(points)]


def _each(make: Callable[[int, int], dict]) -> Callable[[list[int]], list[dict]]:
    """A fault from one item's answer, given (its index, its K)."""
    return lambda points: [make(i, k) for i, k in enumerate(points)]


def _curve_to(k: int, value) -> list | None:
    """The right curve for K points with `value` as its last point (none for one score)."""
    return None if k == 1 else [*curve(k)[:-1], value]


# fault -> (the batch answer's items for episodes asked with these progress_points, what the
# client must say is wrong: a piece of its protocol error)
FAULTS: dict[str, tuple[Callable[[list[int]], list[dict]], str]] = {
    "score_7.5": (_each(lambda i, k: {"index": i, "response": response(7.5, _curve_to(k, 7.5))}), "is 7.5"),
    "score_-3.0": (_each(lambda i, k: {"index": i, "response": response(-3.0, _curve_to(k, -3.0))}), "is -3.0"),
    "score_nan": (_each(lambda i, k: {"index": i, "response": response(float("nan"), curve(k))}), "is nan"),
    "indices_100": (lambda p: [{**item, "index": 100 + item["index"]} for item in good(p)], "indices are [100"),
    "indices_all_0": (lambda p: [{**item, "index": 0} for item in good(p)], "indices are [0, 0"),
    "neither": (_each(lambda i, k: {"index": i}), "neither a response nor an error"),
    "too_few": (lambda p: good(p)[:-1], "items for"),
    "curve_point_2": (
        _each(lambda i, k: {"index": i, "response": response(GOOD, [2.0, *(curve(k) or [GOOD])[1:]])}),
        "is 2.0",
    ),
    "not_the_schema": (_each(lambda i, k: {"index": i, "response": {"score": GOOD}}), "documented schema"),
    # lenient readings (pydantic's lax mode) that became rewards
    "score_true": (_each(lambda i, k: {"index": i, "response": response(True, _curve_to(k, True))}), "valid number"),
    "score_string": (_each(lambda i, k: {"index": i, "response": response("0.7", _curve_to(k, 0.7))}), "valid number"),
    "progress_bools": (
        _each(lambda i, k: {"index": i, "response": response(1.0, [False] * (k - 1) + [True])}),
        "valid number",
    ),
    "index_string": (lambda p: [{**item, "index": str(item["index"])} for item in good(p)], "valid integer"),
    "index_true": (
        lambda p: [{**item, "index": True if item["index"] == 1 else item["index"]} for item in good(p)],
        "valid integer",
    ),
    "index_float": (lambda p: [{**item, "index": float(item["index"])} for item in good(p)], "valid integer"),
    # answers whose parts disagree
    "no_number_with_score": (
        _each(lambda i, k: {"index": i, "response": response(0.9, _curve_to(k, 0.9), "no_number")}),
        "says the answer gave no score",
    ),
    "null_score_ok": (_each(lambda i, k: {"index": i, "response": response(None, _curve_to(k, None))}), "null"),
    "score_not_last_point": (
        _each(lambda i, k: {"index": i, "response": response(GOOD, [*(curve(k) or [])[:-1], 0.9])}),
        "not its curve's last point",
    ),
}

# curves of the wrong length: wrong only where K > 1 was asked
CURVE_FAULTS: dict[str, tuple[Callable[[list[int]], list[dict]], str]] = {
    "curve_2_points": (_each(lambda i, k: {"index": i, "response": response(GOOD, curve(2))}), "has 2 points"),
    "curve_20_points": (_each(lambda i, k: {"index": i, "response": response(GOOD, curve(20))}), "has 20 points"),
    "curve_missing": (_each(lambda i, k: {"index": i, "response": response(GOOD)}), "has no progress curve"),
}
ALL_FAULTS = {**FAULTS, **CURVE_FAULTS}


def asked_points(body: bytes, content_type: str, path: str) -> list[int]:
    """Each episode's progress_points in a /score or /score/batch request body."""
    if path == "/score":
        return [json.loads(body).get("progress_points", 1)]
    if content_type == raw_batch.CONTENT_TYPE:
        return [item.progress_points for item in raw_batch.decode(body)[0].requests]
    return [item.get("progress_points", 1) for item in json.loads(body)["requests"]]


class FaultyServer:
    """Answers /score/batch (JSON or raw) and /score with `fault` for the first `faulty` requests,
    then right (every score GOOD, every curve the K points asked for); /health says ok."""

    def __init__(self, fault: str, faulty: int, max_items: int | None = None):
        self.fault, self.faulty, self.requests = fault, faulty, 0
        self.max_items = max_items  # larger batches: a proxy's 413 in HTML (nginx's client_max_body_size)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _answer(self, body: dict) -> None:
                # NaN stays NaN, as a faulty server writes it
                self._send(200, json.dumps(body).encode(), "application/json")

            def do_GET(self) -> None:
                self._answer({"status": "ok", "backend": "faulty", "engine": "none", "model": "none"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                owner.requests += 1
                points = asked_points(body, self.headers["content-type"], self.path)
                if owner.max_items is not None and len(points) > owner.max_items:
                    page = b"<html><body><h1>413 Request Entity Too Large</h1></body></html>"
                    self._send(413, page, "text/html")
                    return
                bad = owner.requests <= owner.faulty
                items = ALL_FAULTS[owner.fault][0](points) if bad else good(points)
                if self.path == "/score":
                    self._answer(items[0].get("response") or {})
                else:
                    self._answer({"results": items})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self) -> FaultyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()
