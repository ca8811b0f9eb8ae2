"""Engines by name. The registry holds (module, class) pairs so choosing one never imports another."""

from __future__ import annotations

import importlib

from reward_server.engines.base import AnswerWordsUnsupported, Engine, EngineConfig, EngineDead

ENGINES: dict[str, tuple[str, str, str]] = {
    "vllm": ("reward_server.engines.vllm.engine", "VllmEngine", "vLLM (AsyncLLM): continuous batching"),
    "hf": ("reward_server.engines.hf_engine", "HFEngine", "transformers: dynamic micro-batching"),
    "fake": ("reward_server.engines.fake_engine", "FakeEngine", "no model: scripted answers, for tests"),
}


def load_engine(name: str, config: EngineConfig) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
    module, cls, _ = ENGINES[name]
    return getattr(importlib.import_module(module), cls)(config)


__all__ = ["ENGINES", "AnswerWordsUnsupported", "Engine", "EngineConfig", "EngineDead", "load_engine"]
