"""Warm the engine at start-up with a synthetic batch of the configured shapes.

The first batch a freshly started engine scores pays one-time costs (kernels compiled or tuned
for the vision encoder's sequence lengths, allocator growth, the first sampler calls): on one
H200 the first 64-episode batch took twice the steady time, and every training run's first step
paid it. The service runs this before `/health` says `ok`, so the first real batch runs at
steady speed.

The synthetic episodes take the path real ones take after the body is read: frames of the
configured size are picked and resized onto the model grid (`prepare_raw`), the profile builds
the prompt, and the engine scores them concurrently, as one batch. Each score mode family the
server offers is warmed: the default one and, if the profile has it, `logprob` (one prefill,
restricted next token), which runs a different sampler path. Generation is capped at a few
tokens: only the shapes matter, never the answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np

from reward_protocol.score import DEFAULT_MAX_PIXELS, BackendKwargs, ScoreMode
from reward_server.media.decoding import prepare_raw

logger = logging.getLogger(__name__)

WARMUP_MAX_TOKENS = 16
WARMUP_TASK = "put the black bowl in the bottom drawer of the cabinet and close it"


@dataclass(frozen=True)
class WarmupReport:
    episodes: int
    frames: int
    size: int
    score_modes: list[str]
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def synthetic_episode(frames: int, size: int, seed: int) -> np.ndarray:
    """A textured table with a block moving across it: real-looking pixels (never a constant
    frame, which some processors treat specially), different for every seed."""
    rng = np.random.default_rng(seed)
    cell = max(1, size // 32)
    side = -(-size // cell)
    base = rng.integers(40, 220, size=(side, side, 3), dtype=np.uint8).repeat(cell, 0).repeat(cell, 1)[:size, :size]
    video = np.repeat(base[None], frames, axis=0)
    block = max(4, size // 6)
    for t in range(frames):
        x = int((size - block) * t / max(1, frames - 1))
        video[t, size // 2 - block // 2 : size // 2 + block // 2, x : x + block] = (200, 30, 30)
    return video


def warmup_modes(profile) -> list[ScoreMode]:
    """The score modes to warm: the server's default, and logprob where the profile offers it."""
    default = profile.resolve_score_mode(BackendKwargs())
    modes: list[ScoreMode] = [default]
    if "logprob" in profile.available_score_modes() and default != "logprob":
        modes.append("logprob")
    return modes


async def warm_up(engine, profile, batch: int, frames: int, size: int) -> WarmupReport:
    """Score `batch` synthetic episodes per warmed score mode, all at once; raises what the engine
    raises (an engine that cannot score a synthetic batch cannot serve)."""
    started = time.perf_counter()
    modes = warmup_modes(profile)
    max_tokens = min(WARMUP_MAX_TOKENS, profile.sampling_defaults.max_tokens)
    spec = profile.frame_spec

    async def one(seed: int, mode: ScoreMode) -> None:
        raw = synthetic_episode(frames, size, seed)
        video = await asyncio.to_thread(prepare_raw, raw, frames, DEFAULT_MAX_PIXELS, spec)
        kwargs = BackendKwargs(score_mode=mode, max_tokens=None if mode == "logprob" else max_tokens)
        request = profile.build(WARMUP_TASK, video, kwargs, mode)
        request.request_id = f"warmup-{uuid.uuid4().hex}"
        await engine.generate(request)

    work = [one(i, mode) for mode in modes for i in range(batch)]
    await asyncio.gather(*work)
    report = WarmupReport(batch * len(modes), frames, size, list(modes), time.perf_counter() - started)
    logger.info(
        "warm-up: %d synthetic episodes (%d frames of %dx%d, score modes %s) in %.2f s",
        report.episodes,
        frames,
        size,
        size,
        ", ".join(modes),
        report.seconds,
    )
    return report
