"""Dense rewards from a progress curve: which env step each point's reward belongs to, and how it
reaches the rollout buffer after the fact.

The judge answers when an episode ends, so the env hands RLinf today's terminal reward
(`reward_coef x score` at the done step, `use_rel_reward`); the curve then says where that
reward was earned. Point k's gain (its progress minus the previous point's, times reward_coef)
belongs to the action that produced the last frame of its prefix, so it is *moved* there from
the done step: the episode's rewards still sum to `reward_coef x score`, and what the env logs
as its return does not change. The moves are applied by RLinf's env worker (the
rlinf_patches/env_worker.patch calls `place`) to the rewards it keeps per chunk step, before
the rollout goes to the actor. Numpy only, like the rest of the env-side client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reward_protocol.frames import FrameSpec
from reward_protocol.progress import gains, prefix_ends

Move = tuple[int, float]  # (action index in the episode, 0-based; reward added there)


class PlacementError(RuntimeError):
    """A move points at a step that is no longer (or not yet) in the env worker's buffer."""


def model_frame_count(spec: FrameSpec, nframes: int, sent: int) -> int:
    """How many frames the server shows the model for `sent` frames asked as `nframes`: the T
    of the curve rule (reward_protocol.progress)."""
    return spec.frame_count(nframes, sent)


def point_frames(steps: Sequence[int], nframes: int, points: int, spec: FrameSpec) -> list[int]:
    """For each point of a curve, the episode step (frame index: 0 is the reset frame) of the last
    frame its prefix shows, given the steps of the frames sent; the server picks its frames from
    those by `FrameSpec.pick_steps` (padding a short episode with its last frame), as here."""
    model_steps = [steps[i] for i in spec.pick_steps(len(steps), nframes)]
    return [model_steps[end - 1] for end in prefix_ends(len(model_steps), points)]


def moves(
    frame_steps: Sequence[int], curve: Sequence[float | None], done_action: int, reward_coef: float
) -> list[Move]:
    """The moves that place each point's gain at the action whose frame ends its prefix (frame s
    came from action s - 1; the reset frame's gain goes to the first action), taken from the done
    action, which holds the whole terminal reward. Gains that belong to the done action stay."""
    placed: dict[int, float] = {}
    for step, gain in zip(frame_steps, gains(curve), strict=True):
        action = min(max(step - 1, 0), done_action)
        if action == done_action or gain == 0.0:
            continue
        placed[action] = placed.get(action, 0.0) + reward_coef * gain
    if not placed:
        return []
    return [*sorted(placed.items()), (done_action, -sum(placed.values()))]


def place(moves_by_env: dict[int, list[Move]], current: Any, earlier: list[Any], chunk_index: int) -> int:
    """Add each env's moves to RLinf's per-chunk-step rewards ([num_envs, actions per chunk]
    tensors): `current` holds the chunk just stepped (number `chunk_index` of the episode, which
    began at chunk 0 of this rollout epoch) and `earlier[-j]` the chunk j steps before it. Returns
    how many entries were changed; a step outside the buffer raises PlacementError before any change."""
    per_chunk = current.shape[1]
    targets = []
    for env, env_moves in moves_by_env.items():
        for action, amount in env_moves:
            chunk, slot = divmod(action, per_chunk)
            back = chunk_index - chunk
            if back < 0 or back > len(earlier):
                raise PlacementError(
                    f"env {env}: a reward for action {action} (chunk {chunk}) cannot be placed from chunk "
                    f"{chunk_index} ({len(earlier)} earlier chunks held); dense rewards need episodes that "
                    "start with the rollout epoch (env.train.auto_reset: False)"
                )
            targets.append((current if back == 0 else earlier[-back], env, slot, amount))
    for rewards, env, slot, amount in targets:
        rewards[env, slot] += amount
    return len(targets)


__all__ = ["Move", "PlacementError", "model_frame_count", "moves", "place", "point_frames"]
