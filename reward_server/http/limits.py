"""How the body limits derive from each other, so a body the server admits is one it can parse.

A JSON body is parsed in one piece in a decode worker (media/decoding.py), whose address space is
capped at `--decode-memory-mb` above its start. orjson reserves up to ~13 times a document's
size while parsing it, and the body reaches the worker as a pickled copy: measured, a batch of
inline frames needs ~14x its size there (a worker with 512 MiB parsed 34 MiB and died on
37 MiB; with 1024 MiB it died on 75 MiB). So a JSON body is admitted only up to
--decode-memory-mb / JSON_PARSE_FACTOR (256 MiB by default), refused above that from its
Content-Length with a 413 naming both limits, before a byte of it is read. A raw batch
(application/x-reward-batch) is never parsed as a whole (its frames are used in place), so it
may use all of `--max-body-mb`.

`/health` advertises the limits a request must fit (`server_limits`), so the client cuts a batch
into requests this server accepts rather than meeting a 413 it cannot retry.
"""

from __future__ import annotations

from dataclasses import dataclass

from reward_protocol.score import MAX_BATCH_ITEMS, ServerLimits
from reward_server.settings import ServerSettings

JSON = "application/json"
JSON_PARSE_FACTOR = 16  # decode-worker address space per JSON body byte (measured ~14, see above)
MIB = 1024 * 1024


@dataclass(frozen=True)
class BodyLimit:
    bytes: int
    why: str  # the flag(s) that set it, for the 413

    def refusal(self, length: int) -> str:
        return f"a body of {length} bytes exceeds the limit of {self.bytes} bytes ({self.why})"


def json_body_limit(settings: ServerSettings) -> int:
    """The largest JSON body a decode worker parses within its memory budget (or --max-body-mb)."""
    parse = settings.decode_memory_mb * MIB // JSON_PARSE_FACTOR
    return min(int(settings.max_body_mb * MIB), parse)


def body_limit(settings: ServerSettings, content_type: str) -> BodyLimit:
    max_body = int(settings.max_body_mb * MIB)
    if content_type != JSON:
        return BodyLimit(max_body, "--max-body-mb")
    limit = json_body_limit(settings)
    if limit >= max_body:
        return BodyLimit(max_body, "--max-body-mb")
    return BodyLimit(
        limit,
        f"a JSON body is parsed whole in a decode worker, within --decode-memory-mb {settings.decode_memory_mb} "
        f"/ {JSON_PARSE_FACTOR}; send the frames as a raw batch (application/x-reward-batch, up to "
        f"--max-body-mb {settings.max_body_mb:g}), fewer episodes per request, or raise --decode-memory-mb",
    )


def server_limits(settings: ServerSettings) -> ServerLimits:
    """What one request may hold here: the body limits above, what the server holds at once
    (--max-inflight-mb: a body beyond it alone is refused), and episodes per batch (--max-queue)."""
    held = int(settings.effective_max_inflight_mb() * MIB)
    return ServerLimits(
        max_json_body_bytes=min(body_limit(settings, JSON).bytes, held),
        max_raw_body_bytes=min(int(settings.max_body_mb * MIB), held),
        max_batch_items=min(MAX_BATCH_ITEMS, settings.max_queue),
        request_timeout_s=settings.request_timeout_s,
    )
