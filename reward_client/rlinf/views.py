"""Which camera views of an RLinf env's observation the judge sees (`env.train.reward_model.views`).

RLinf's envs hand their policy an observation dict with the same image keys: `main_images`
([B, H, W, 3]: LIBERO's agent view, ManiSkill's base camera), `wrist_images` ([B, H, W, 3]:
LIBERO's wrist camera) and `extra_view_images` ([B, V, H, W, 3]: ManiSkill's other cameras, and
what StarVLA's wrapper takes). A view is named by its key; `extra_view_images` stands for each of
its V cameras, `extra_view_images[i]` for one. The judge gets one clip per view, each labelled
with a camera name (`label`) that the server's profile shows the model; one view is sent as a
plain one-view request. Torch tensors on any device become host numpy here (`to_numpy`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reward_protocol.score import MAX_VIEWS

VIEW_KEYS = ("main_images", "wrist_images", "extra_view_images")
DEFAULT_VIEWS = ("main_images",)
_LABELS = {"main_images": "main camera", "wrist_images": "wrist camera", "extra_view_images": "extra camera"}
_NAME = re.compile(r"(main_images|wrist_images|extra_view_images)(?:\[(\d+)\])?")

View = tuple[str, np.ndarray]  # (camera label, frames of every env [num_envs, H, W, 3] or one episode's [T, H, W, 3])


def to_numpy(value: Any) -> np.ndarray:
    """A torch tensor on any device, or anything numpy takes, as a host numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _parse(name: str) -> tuple[str, int | None]:
    match = _NAME.fullmatch(name)
    if match is None or (match.group(2) is not None and match.group(1) != "extra_view_images"):
        raise ValueError(
            f"unknown view {name!r}: allowed are {', '.join(VIEW_KEYS)} and extra_view_images[i] (one of its cameras)"
        )
    return match.group(1), None if match.group(2) is None else int(match.group(2))


def check_views(names: Sequence[str]) -> list[str]:
    """The configured view names, or a ValueError saying what is wrong and what is allowed."""
    names = list(names)
    if not names:
        raise ValueError(f"views is empty: name at least one of {', '.join(VIEW_KEYS)}")
    for name in names:
        _parse(name)
    if len(set(names)) != len(names):
        raise ValueError(f"views names a camera twice: {names}")
    if len(names) > MAX_VIEWS:
        raise ValueError(f"views names {len(names)} cameras; a request carries at most {MAX_VIEWS}")
    return names


def several(names: Sequence[str]) -> bool:
    """Whether these names can give more than one view (extra_view_images alone may hold several)."""
    return len(names) > 1 or names[0] == "extra_view_images"


def pick(obs: Mapping[str, Any], names: Sequence[str]) -> list[View]:
    """(label, frames [num_envs, H, W, 3] uint8 on the host) of each named view, in order."""
    out: list[View] = []
    for name in names:
        key, index = _parse(name)
        value = obs.get(key)
        if value is None:
            present = sorted(k for k in VIEW_KEYS if obs.get(k) is not None)
            raise ValueError(
                f"env.train.reward_model.views names {name}, but this env's observation has no {key} (it has: "
                f"{', '.join(present) or 'no camera frames'})"
            )
        frames = to_numpy(value)
        if key != "extra_view_images":
            out.append((_LABELS[key], frames))
            continue
        if frames.ndim != 5:
            raise ValueError(f"extra_view_images must be [B, V, H, W, 3], got shape {list(frames.shape)}")
        cameras = range(frames.shape[1]) if index is None else [index]
        if index is not None and index >= frames.shape[1]:
            raise ValueError(f"views names {name}, but extra_view_images holds {frames.shape[1]} cameras")
        out += [(f"{_LABELS[key]} {i}", frames[:, i]) for i in cameras]
    if len(out) > MAX_VIEWS:
        raise ValueError(f"views give {len(out)} cameras ({names}); a request carries at most {MAX_VIEWS}")
    return out


def frames_of(obs: Any, names: Sequence[str]) -> tuple[np.ndarray, list[View]]:
    """(the first view's frames, every view when there are several) from an env's observation
    dict; an array is `main_images` itself (LIBERO's patch before views handed only that)."""
    if isinstance(obs, Mapping):
        views = pick(obs, names)
        return views[0][1], views if len(views) > 1 else []
    if list(names) != list(DEFAULT_VIEWS):
        raise ValueError(
            f"env.train.reward_model.views {list(names)} needs the env's whole observation, and this env's patch "
            "hands the hook main_images only: re-apply the patches (bash scripts/apply_rlinf_patches.sh RLINF_DIR)"
        )
    return to_numpy(obs), []


__all__ = ["DEFAULT_VIEWS", "VIEW_KEYS", "View", "check_views", "frames_of", "pick", "several", "to_numpy"]
