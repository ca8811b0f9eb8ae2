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
    match = _NAME.fullmatch(name.strip())
    if match is None or (match.group(2) is not None and match.group(1) != "extra_view_images"):
        raise ValueError(
            f"unknown view {name!r}: allowed are {', '.join(VIEW_KEYS)} and extra_view_images[i] (one of its cameras)"
        )
    return match.group(1), None if match.group(2) is None else int(match.group(2))


def normalized(name: str) -> str:
    """The one spelling of a view name: surrounding whitespace dropped, a camera index without
    leading zeros (`extra_view_images[00]` is `extra_view_images[0]`)."""
    key, index = _parse(name)
    return key if index is None else f"{key}[{index}]"


def check_views(names: Sequence[str]) -> list[str]:
    """The configured view names, normalized (`normalized`), or a ValueError saying what is wrong
    and what is allowed: each camera named once, so no two views of a request carry one camera
    under one label (a request cannot carry them, and a camera would be lost)."""
    given = list(names)
    if not given:
        raise ValueError(f"views is empty: name at least one of {', '.join(VIEW_KEYS)}")
    out = [normalized(name) for name in given]
    seen: dict[str, str] = {}
    for name, spelled in zip(out, given, strict=True):
        if name in seen:
            twice = f"{seen[name]!r} and {spelled!r} are both {name}" if seen[name] != spelled else f"{name} twice"
            raise ValueError(f"views names a camera twice ({twice}); name each camera once")
        seen[name] = spelled
    indexed = [name for name in out if name.startswith("extra_view_images[")]
    if "extra_view_images" in out and indexed:
        raise ValueError(
            f"views names extra_view_images, which stands for each of its cameras, and {', '.join(indexed)} too: "
            "name either extra_view_images (all of them) or the cameras one by one (extra_view_images[i])"
        )
    if len(out) > MAX_VIEWS:
        raise ValueError(f"views names {len(out)} cameras; a request carries at most {MAX_VIEWS}")
    return out


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
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):  # names that check_views did not normalize (a config built by hand)
        raise ValueError(f"views {list(names)} give one camera twice ({labels}); name each camera once")
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


__all__ = [
    "DEFAULT_VIEWS",
    "VIEW_KEYS",
    "View",
    "check_views",
    "frames_of",
    "normalized",
    "pick",
    "several",
    "to_numpy",
]
