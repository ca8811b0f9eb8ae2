"""How large an answer can be, and reading one no further than that.

A reward server's answer has a known shape: per episode a score, a parse status, timings, at most
`max_tokens` of model output (8192, the protocol's most, when the request leaves it to the server),
a curve of `progress_points` values, the prompt when `return_prompt` asks for it, or an error. So
the request says how many bytes its answer can need; the client reads no more. Before, it read an
answer whole whatever its size (a faulty server's 300 MiB answer: +2.4 GB of client memory, again
on every retry) and inflated gzip without a bound (0.5 MiB becoming 512 MiB: +2.6 GB).

`AnswerMeter` counts the bytes on the wire and the bytes they decode to apart, inflates gzip or
deflate with a bound on each step (zlib's max_length: a bomb never inflates past the cap), and
stops at the cap with a RewardProtocolError, which the client counts and retries like any answer
that cannot be right. The caps are generous (several times a real answer): they bound memory, they
do not judge answers.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import httpx

from reward_client.errors import RewardProtocolError
from reward_protocol.score import ScoreOptions

ITEM_BYTES = 16 * 1024  # one item's fields but the model's text: score, status, timings, ids, an error message
BYTES_PER_TOKEN = 48  # a token's text as JSON: up to ~8 UTF-8 characters, escaped as \uXXXX at worst
MAX_OUTPUT_TOKENS = 8192  # BackendKwargs.max_tokens' most: what a server's default may generate
PROGRESS_POINT_BYTES = 32  # one curve point as JSON ("0.12345678901234567," or "null,")
PROMPT_BYTES = 1024 * 1024  # a rendered prompt echoed back (return_prompt), besides 6x the texts the request gave
ANSWER_OVERHEAD = 64 * 1024  # a whole answer's frame, or a request-level error body
HEALTH_ANSWER_BYTES = 64 * 1024  # /health: status, names, limits, frame spec
ACCEPT_ENCODING = "gzip, deflate"  # what the client asks for: the encodings it can inflate with a bound


def item_answer_bytes(options: ScoreOptions) -> int:
    """The most bytes one episode's part of an answer can be, from what its request asks for."""
    kwargs = options.backend_kwargs
    size = ITEM_BYTES + options.progress_points * PROGRESS_POINT_BYTES
    size += (kwargs.max_tokens or MAX_OUTPUT_TOKENS) * BYTES_PER_TOKEN
    if kwargs.return_prompt:
        texts = len(options.task_text) + len(kwargs.prompt or "") + len(kwargs.system_prompt or "")
        size += PROMPT_BYTES + 6 * texts
    return size


def batch_answer_bytes(item_sizes: Sequence[int]) -> int:
    """The most bytes an answer for these items can be (their item_answer_bytes)."""
    return ANSWER_OVERHEAD + sum(item_sizes)


class _Inflate:
    """One content coding undone, never more than `limit` bytes out of one step."""

    def __init__(self, coding: str):
        self.coding = coding
        # gzip, or deflate as most servers send it (zlib-wrapped); raw deflate is tried on failure
        self._z = zlib.decompressobj(zlib.MAX_WBITS | 32)
        self._started = False

    def step(self, data: bytes, limit: int) -> bytes:
        try:
            out = self._z.decompress(data, limit)
        except zlib.error as exc:
            if self.coding != "deflate" or self._started:
                raise RewardProtocolError(f"the answer's {self.coding} coding is broken: {exc}") from None
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)  # deflate without its zlib wrapper
            out = self.step(data, limit)
        self._started = True
        return out

    def flush(self) -> bytes:
        return self._z.flush()


class AnswerMeter:
    """Reads one HTTP answer within `cap` bytes, on the wire and decoded, else RewardProtocolError."""

    def __init__(self, response: httpx.Response, cap: int):
        self.response, self.cap = response, cap
        self.wire = 0
        self.size = 0
        self.chunks: list[bytes] = []
        # read already (an event hook of the caller's read it whole): nothing left to bound
        self.pending = not response.is_stream_consumed
        declared = response.headers.get("content-length", "")
        if self.pending and declared.isdigit() and int(declared) > cap:
            raise self._too_large(f"its Content-Length says {int(declared)}")
        codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
        self.decoders = [self._decoder(c) for c in reversed(codings) if c not in ("", "identity")]

    def _decoder(self, coding: str) -> _Inflate:
        if coding in ("gzip", "x-gzip", "deflate"):
            return _Inflate("deflate" if coding == "deflate" else "gzip")
        raise RewardProtocolError(
            f"the answer's Content-Encoding is {coding!r}; this client asks for and reads {ACCEPT_ENCODING} or none"
        )

    def _too_large(self, what: str) -> RewardProtocolError:
        return RewardProtocolError(
            f"the answer is larger than {self.cap} bytes, the most an answer to this request can be ({what}; "
            "a faulty server or proxy)"
        )

    def feed(self, chunk: bytes) -> None:
        """One chunk as it came off the wire."""
        self.wire += len(chunk)
        if self.wire > self.cap:
            raise self._too_large(f"{self.wire} bytes on the wire so far")
        self._add(self._decode(chunk))

    def _decode(self, data: bytes) -> bytes:
        for decoder in self.decoders:
            data = decoder.step(data, self.cap - self.size + 1)  # one byte more than may come: over the cap
        return data

    def _add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.cap:
            raise self._too_large(f"it decodes to more than {self.cap} bytes")
        if data:
            self.chunks.append(data)

    def answer(self) -> httpx.Response:
        """The answer, its body read and decoded within the cap."""
        if not self.pending:
            if len(self.response.content) > self.cap:
                raise self._too_large(f"{len(self.response.content)} bytes")
            return self.response
        for k, decoder in enumerate(self.decoders):  # what each coding still holds, through the ones after it
            data = decoder.flush()
            for later in self.decoders[k + 1 :]:
                data = later.step(data, self.cap - self.size + 1)
            self._add(data)
        skip = {"content-encoding", "content-length", "transfer-encoding"}
        headers = [(k, v) for k, v in self.response.headers.multi_items() if k.lower() not in skip]
        return httpx.Response(
            self.response.status_code,
            headers=headers,
            content=b"".join(self.chunks),
            request=self.response.request,
            extensions=self.response.extensions,
        )
