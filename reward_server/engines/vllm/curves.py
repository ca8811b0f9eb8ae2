"""Progress curves on vLLM: each clip of an episode processed once per curve, the shorter points
started as soon as the longest is in the engine.

A curve's K points are K requests whose prompts share their clips (Profile.build_curve). What
makes one clip cost once instead of once per point that shows it:

- Stable per-item ids (vLLM's `multi_modal_uuids`): the clips the points share, and the image a
  profile shows before them (PRIMO-R1's first frame), get one id per curve, so vLLM neither
  hashes their pixels again nor, with its processor cache on, runs the HF processor on them
  again or sends their tensors to the engine core again (the front end sends the id, the engine
  core takes the tensor from its own cache). vLLM's prefix cache keys a prompt's blocks by these
  ids as well, so a shared prefix goes as far as its items share ids. Ids are unique to one curve
  attempt (a fresh uuid4 each time), so nothing outside the curve ever hits them: a client that
  resends an aborted episode gets new ids, and the cache's two halves cannot disagree about it.
- Order: the longest point's inputs are processed and handed to vLLM first (the longest of each
  chain of clips, when the profile cuts two: `--progress-partial-groups shifted`); the others
  are processed after it (their clips are then cache hits) and handed over right behind it. vLLM
  commits a prompt's KV blocks to its prefix cache when it schedules them, so the shorter points,
  queued behind the longest, find the shared blocks in the same or the next scheduler step.
  "Handed" means processed (in the engine's input pool, or inline without one) and about to be
  sent to AsyncLLM, with no suspension in between (the front end's cache half must see the
  longest before the others, as the engine core's half receives them).

Measured on one H100 at 7B shapes, 64 episodes (docs/performance.md): K = 8 costs 1.43x and
K = 16 3.17x of K = 1, under their computed-token ratios (1.78x, 3.53x); before, 2.85x and 5.97x.
The processor cache gives most of it; the earlier start ~5-12% more.

`--engine-option curve_start=prefilled` restores the former order (the shorter points wait for
the longest's first output) and `curve_clip_ids=false` the former content hashing (and with it
no processor cache, unless `mm_processor_cache_gb` is given); both are kept for measuring
(reward_tools.bench_curves, scripts/gpu/bench_gpu.sh curves).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from reward_server.engines.base import gather_all
from reward_server.engines.io import EngineOutput, EngineRequest
from reward_server.engines.vllm.patches import parse_options

CurveStart = Literal["handed", "prefilled"]


@dataclass(frozen=True)
class CurveSettings:
    start: CurveStart = "handed"  # when the shorter points go in: the longest handed over, or prefilled
    clip_ids: bool = True  # stable per-clip ids (multi_modal_uuids) instead of content hashes


def curve_settings(options: dict[str, Any]) -> CurveSettings:
    """The curve settings an engine's `--engine-option`s ask for (checked: a typo is an error)."""
    typed = parse_options(options)
    return CurveSettings(start=typed.curve_start, clip_ids=typed.curve_clip_ids)


def assign_clip_ids(requests: list[EngineRequest], curve_id: str) -> None:
    """Give every video and image item of the curve's requests an id: the same pixels in memory
    the same id, each tail its own. build_curve passes a clip that several points share as the
    very same array, and PRIMO-R1's first frame is a view of the first clip in every point, so
    an item is known by where its pixels are (pixels_at). vLLM keys its prefix cache by these
    ids too: an image with an id of its own in every point (as before) ended every point's shared
    prefix at that image, and a PRIMO-R1 curve shared no tokens at all."""
    ids: dict[tuple, str] = {}

    def item_id(array: np.ndarray, kind: str) -> str:
        key = (kind, *pixels_at(array))  # the arrays outlive this call: no address is reused meanwhile
        if key not in ids:
            ids[key] = f"{curve_id}-{kind}{len(ids)}"
        return ids[key]

    for request in requests:
        request.clip_ids = [item_id(video, "c") for video in request.videos()]
        request.image_ids = [item_id(image, "i") for image in request.images]


def pixels_at(array: np.ndarray) -> tuple:
    """Where an array's pixels are: two arrays (or views) that start at the same address with the
    same shape, strides and type show the same pixels."""
    return (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)


def item_ids(request: EngineRequest) -> dict[str, list[str]]:
    """vLLM's `multi_modal_uuids` for a request: a curve's item ids (assign_clip_ids), else ids
    unique to this request. No item can then hit the processor cache on an entry another (maybe
    aborted) request left in the front end's half, which is how the halves used to drift apart
    when a client resent an aborted episode; identical images in two requests are computed twice."""
    salt = uuid.uuid4().hex[:12]
    ids: dict[str, list[str]] = {}
    videos = request.videos()
    if videos:
        ids["video"] = list(request.clip_ids) or [f"{salt}-v{i}" for i in range(len(videos))]
    if request.images:
        ids["image"] = list(request.image_ids) or [f"{salt}-i{i}" for i in range(len(request.images))]
    return ids


@dataclass
class CurveMarks:
    """Events of a chain's longest point: handed to vLLM, and its prompt computed."""

    handed: asyncio.Event
    prefilled: asyncio.Event


def chain_leaders(requests: list[EngineRequest]) -> list[EngineRequest]:
    """The longest point of each chain of clips (Profile.build_curve): the points grouped by their
    first clip (the same pixels), the last of each group, as the points come in the order of
    their ends. One chain unless a profile cuts a second one (`--progress-partial-groups
    shifted`); a point whose only clip is its own tail is a chain of its own."""
    last: dict[tuple, EngineRequest] = {}
    for request in requests:
        videos = request.videos()
        last[pixels_at(videos[0]) if videos else ("alone", request.request_id)] = request
    return list(last.values())


def leaders_first(requests: list[EngineRequest]) -> tuple[list[EngineRequest], list[EngineRequest]]:
    """A curve's points in the order their inputs must be processed and handed to vLLM: each
    chain's longest point (chain_leaders), then the others, whose clips are then cache hits."""
    leaders = chain_leaders(requests)
    return leaders, [r for r in requests if all(r is not leader for leader in leaders)]


async def run_curve(engine: Any, requests: list[EngineRequest], settings: CurveSettings) -> list[EngineOutput]:
    """The points of one curve on a VllmEngine, each chain's longest point first (see the module's
    notes): the others go in once every such point is handed over (or prefilled)."""
    leaders = chain_leaders(requests)
    if settings.clip_ids:
        assign_clip_ids(requests, uuid.uuid4().hex)
    marks = {r.request_id: CurveMarks(asyncio.Event(), asyncio.Event()) for r in leaders}
    engine.curve_marks.update(marks)
    gates = [m.prefilled if settings.start == "prefilled" else m.handed for m in marks.values()]
    first = {r.request_id: asyncio.ensure_future(engine.generate(r)) for r in leaders}
    waiter = asyncio.ensure_future(asyncio.gather(*(gate.wait() for gate in gates)))
    try:
        pending: set[asyncio.Future] = {waiter, *first.values()}
        while waiter in pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not waiter and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
    except BaseException:
        for task in first.values():
            task.cancel()
        raise
    finally:
        waiter.cancel()
        for request_id in marks:
            engine.curve_marks.pop(request_id, None)
    return await gather_all(
        [_await(first[r.request_id]) if r.request_id in first else engine.generate(r) for r in requests]
    )


async def _await(task: asyncio.Future) -> Any:
    return await task
