"""Scoring profiles by backend name. Looking a name up imports nothing heavy."""

from __future__ import annotations

import importlib

from reward_server.profiles.base import Profile, SamplingDefaults, UnsupportedOption

# canonical backend name -> (module, class, one-line description for --help)
PROFILES: dict[str, tuple[str, str, str]] = {
    "qwen2_5_vl_vllm": (
        "reward_server.profiles.qwen2_5_vl",
        "Qwen25VLProfile",
        "Qwen2.5-VL-Instruct: progress prompt (0-100), yes/no logprob or P(True)",
    ),
    "qwen3_vl": (
        "reward_server.profiles.qwen3_vl",
        "Qwen3VLProfile",
        "Qwen3-VL-Instruct (2B-8B dense): progress prompt (0-100), yes/no logprob or P(True)",
    ),
    "PRIMO-R1": (
        "reward_server.profiles.primo_r1",
        "PrimoR1Profile",
        "PRIMO-R1-7B: official prompt, first frame + video + last frame, <answer> 0-100",
    ),
}

ALIASES: dict[str, str] = {
    "qwen2_5_vl": "qwen2_5_vl_vllm",
    "qwen2.5-vl": "qwen2_5_vl_vllm",
    "qwen3-vl": "qwen3_vl",
    "qwen3_vl_vllm": "qwen3_vl",
    "primo_r1_vllm": "PRIMO-R1",
    "primo_r1": "PRIMO-R1",
    "primo-r1": "PRIMO-R1",
}


class UnknownBackend(ValueError):
    pass


def backend_names() -> list[str]:
    return list(PROFILES) + list(ALIASES)


def canonical_backend(name: str) -> str:
    if name in PROFILES:
        return name
    lowered = name.lower()
    for key in PROFILES:
        if key.lower() == lowered:
            return key
    if lowered in ALIASES:
        return ALIASES[lowered]
    raise UnknownBackend(f"unknown backend {name!r}; known backends: {', '.join(backend_names())}")


def load_profile(name: str, **kwargs) -> Profile:
    module, cls, _ = PROFILES[canonical_backend(name)]
    return getattr(importlib.import_module(module), cls)(**kwargs)


__all__ = [
    "ALIASES",
    "PROFILES",
    "Profile",
    "SamplingDefaults",
    "UnknownBackend",
    "UnsupportedOption",
    "backend_names",
    "canonical_backend",
    "load_profile",
]
