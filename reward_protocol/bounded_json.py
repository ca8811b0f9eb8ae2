"""One JSON decoder with bounds, for every document the server reads from a client.

Request bodies (/score, /score/batch, /v1/chat/completions) and the raw batch header all go
through `loads_bounded`, so the same hostile input gets the same refusal on every route:

- nesting deeper than MAX_DEPTH arrays/objects: checked by a flat scan *before* any parser sees
  the document, so `[` x 100000 never reaches a recursive decoder;
- NaN, Infinity and numbers that overflow a double (1e999): not JSON, never a float('inf');
- integer literals outside the signed 64-bit range: a fast decoder would turn them into a
  rounded float silently (an offset of 2**70 must be refused, not rounded);
- documents over `max_bytes`.

The scan is vectorised (numpy over the bytes, in chunks): brackets count only outside strings,
known by the parity of the quotes before them once escaped quotes are blanked out, so a body of
100 MB of base64 frames costs a fraction of what parsing it does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

MAX_DEPTH = 64

_CHUNK = 1 << 23  # bytes scanned at once (bounds the scan's temporary memory)
_LONG = 19  # digits from which an integer may not fit in int64
_DIGIT_MAP = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))


class InvalidJSON(ValueError):
    """The document is not JSON the server accepts; the message says what is wrong and the limit."""


def _blank_escapes(doc: bytes) -> bytes:
    """The same bytes with every escaped backslash and escaped quote blanked (same length), so
    that each remaining quote opens or closes a string. Pairs are taken left to right, as JSON
    reads them."""
    if b"\\" not in doc:
        return doc
    return doc.replace(b"\\\\", b"__").replace(b'\\"', b"__")


def _too_deep(arr: np.ndarray, max_depth: int) -> bool:
    """Whether brackets outside strings ever nest deeper than max_depth (quotes alternate)."""
    parity, base = 0, 0
    for start in range(0, len(arr), _CHUNK):
        chunk = arr[start : start + _CHUNK]
        quotes = np.flatnonzero(chunk == 0x22)
        folded = chunk | 0x20  # '[' -> '{', ']' -> '}'
        at = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
        at = at[((np.searchsorted(quotes, at) + parity) & 1) == 0]  # an even number of quotes before
        if len(at):
            # '[' 0x5B and '{' 0x7B have bit 1 set, ']' 0x5D and '}' 0x7D do not
            depth = np.cumsum((chunk[at] & 2).astype(np.int8) - 1, dtype=np.int32)
            if base + int(depth.max()) > max_depth:
                return True
            base += int(depth[-1])
        parity = (parity + len(quotes)) & 1
    return False


def _out_of_range_integer(doc: bytes, arr: np.ndarray) -> bytes | None:
    """The first integer literal outside int64 (outside strings, not part of a float), or None.
    A quick test first: no run of _LONG digits, no such integer."""
    if b"0" * _LONG not in doc.translate(_DIGIT_MAP):
        return None
    is_digit = (arr - 0x30) < 10  # uint8 arithmetic wraps: true for b"0".."9" only
    edges = np.flatnonzero(np.diff(is_digit, prepend=False, append=False))
    starts, ends = edges[0::2], edges[1::2]
    long = (ends - starts) >= _LONG
    starts, ends = starts[long], ends[long]
    quotes = np.flatnonzero(arr == 0x22)
    padded = np.concatenate([[0x20, 0x20], arr, [0x20]])  # arr[i] is padded[i + 2]
    before, after = padded[starts + 1], padded[ends + 2]
    signed = before == ord("-")
    before = np.where(signed, padded[starts], before)  # what precedes the sign
    floaty = np.isin(after, list(b".eE")) | np.isin(before, list(b".eE+"))
    outside = (np.searchsorted(quotes, starts) & 1) == 0
    starts, ends, signed = starts[outside & ~floaty], ends[outside & ~floaty], signed[outside & ~floaty]
    # a 19-digit literal fits in uint64: compare its value with 2**63 exactly
    value = np.zeros(len(starts), np.uint64)
    for i in range(_LONG):
        value = value * np.uint64(10) + (arr[np.minimum(starts + i, len(arr) - 1)] - 0x30).astype(np.uint64)
    limit = np.uint64(2**63)
    bad = ((ends - starts) > _LONG) | (value > limit) | ((value == limit) & ~signed)
    if not bad.any():
        return None
    first = int(np.argmax(bad))
    return doc[int(starts[first]) - int(signed[first]) : int(ends[first])]


def check_bounds(doc: bytes, *, what: str = "body", max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than max_depth and out-of-range integers, without parsing `doc`."""
    text = _blank_escapes(doc)
    arr = np.frombuffer(text, np.uint8)
    if text.count(b"[") + text.count(b"{") > max_depth and _too_deep(arr, max_depth):
        raise InvalidJSON(f"{what} is not valid JSON: arrays/objects nest deeper than {max_depth} levels")
    literal = _out_of_range_integer(text, arr)
    if literal is not None:
        shown = literal[:24].decode() + ("..." if len(literal) > 24 else "")
        raise InvalidJSON(f"{what} is not valid JSON: integer {shown} is outside the 64-bit range")


def loads_bounded(
    body: bytes | bytearray | memoryview | str, *, what: str = "body", max_bytes: int | None = None
) -> Any:
    """The decoded document, or InvalidJSON naming `what` (e.g. "body", "raw batch header")."""
    doc = body.encode() if isinstance(body, str) else bytes(body)
    if max_bytes is not None and len(doc) > max_bytes:
        raise InvalidJSON(f"{what} of {len(doc)} bytes exceeds the limit of {max_bytes} bytes")
    check_bounds(doc, what=what)
    try:
        return orjson.loads(doc)
    except SystemError as exc:
        # orjson out of memory while building objects: a SystemError wrapping the MemoryError
        if isinstance(exc.__cause__, MemoryError):
            raise MemoryError(f"parsing {what} needs more memory than this process may use") from None
        raise
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("Not enough memory"):  # the parser's buffer, not the document
            raise MemoryError(f"parsing {what} needs more memory than this process may use") from None
        # orjson refuses NaN, Infinity and 1e999 itself; name the first two (it says "unexpected character")
        if doc[exc.pos : exc.pos + 9].lstrip(b"-").startswith((b"NaN", b"Infinity")):
            raise InvalidJSON(f"{what} is not valid JSON: NaN and Infinity are not numbers in JSON ({exc})") from None
        raise InvalidJSON(f"{what} is not valid JSON: {exc}") from None


__all__ = ["MAX_DEPTH", "InvalidJSON", "check_bounds", "loads_bounded"]
