"""The check a patch that changes what the model computes passes before any request uses it.

`pixel_norm` (uint8 patches, normalized in the vision tower) and `pixel_dtype` (pixels cast to the
model's dtype in the server) claim the vision tower receives the same numbers. The engine checks
that claim in the engine it is about to serve with, once at start (before the warm-up batch): one
small probe episode answered with one greedy token and its top log-probabilities, through the
unpatched path and through each patch's path (separate requests with ids of their own, so no cache
serves one from the other). A patch passes when the same first token comes out and each of the
reference's top log-probabilities is within LOGPROB_TOLERANCE; otherwise it is turned off with a
warning, and so is a patch whose check could not run. The same inputs give the same numbers on one
device, so the tolerance only absorbs kernels that sum in another order; a wrong normalization or a
lossy cast moves them by more (tests/engine/test_patch_registry.py: constants in the wrong channel
order on a random-weight checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from reward_server.engines.io import ChatPrompt, EngineOutput, EngineRequest, Sampling, TextPart, VideoPart

LOGPROB_TOLERANCE = 2e-3  # nats, on each of the reference's top log-probabilities
TOP = 5  # log-probabilities compared per check
PROBE_TEXT = "Describe what happens in the video."


def probe_request(request_id: str, frames: int = 4, size: int = 56, seed: int = 0) -> EngineRequest:
    """One small video episode (textured random pixels, never a constant frame) asking for one
    greedy token with its top log-probabilities."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (size // 4, size // 4, 3), dtype=np.uint8).repeat(4, 0).repeat(4, 1)
    video = np.stack([np.roll(base, 4 * t, axis=1) for t in range(frames)])
    chat = ChatPrompt(system=None, user=(VideoPart(), TextPart(PROBE_TEXT)))
    sampling = Sampling(mode="generate", max_tokens=1, temperature=0.0, logprobs=TOP)
    return EngineRequest(chat=chat, video=video, sampling=sampling, request_id=request_id)


def renamed(request: EngineRequest, request_id: str) -> EngineRequest:
    return replace(request, request_id=request_id)


def first_token(output: EngineOutput) -> tuple[str, dict[str, float]]:
    """The first generated token and its top log-probabilities (token text -> logprob)."""
    if not output.token_logprobs:
        raise ValueError("the engine returned no log-probabilities for the probe")
    first = output.token_logprobs[0]
    return first.token, dict(first.top)


def differs(reference: EngineOutput, patched: EngineOutput, tolerance: float = LOGPROB_TOLERANCE) -> str | None:
    """None when the patched path's first token and top log-probabilities match the reference's
    within `tolerance`; else what differed."""
    token, ref = first_token(reference)
    got_token, got = first_token(patched)
    if got_token != token:
        return f"the first token differs ({got_token!r} against {token!r})"
    worst = 0.0
    for text, logprob in ref.items():
        other = got.get(text)
        if other is None:
            return f"the token {text!r} is in the reference's top {TOP} and not in the patched path's"
        worst = max(worst, abs(other - logprob) if math.isfinite(logprob) else 0.0)
    if worst > tolerance:
        return f"log-probabilities differ by up to {worst:.3g} (tolerance {tolerance:g})"
    return None
