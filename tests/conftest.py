"""Shared fixtures: the tiny checkpoint (built once per session) and real server processes.

Servers run as child processes bound to 127.0.0.1 on a free port and are stopped at the end
of the session, whatever happens.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from reward_client.protocol import InlineFrames
from reward_server.launch import ServerProcess

REPO = Path(__file__).resolve().parents[1]
CPU_PRESET = REPO / "configs" / "server" / "cpu_tiny.yaml"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    from reward_server.tiny_checkpoint import ensure_checkpoint

    cache = os.environ.get("REWARD_SERVER_TEST_CHECKPOINT")
    path = Path(cache) if cache else tmp_path_factory.mktemp("ckpt") / "tiny"
    return str(ensure_checkpoint(path))


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    """Where tests write episodes for video_path requests; the servers allow only this root."""
    return tmp_path_factory.mktemp("videos")


def episode_frames(steps: int = 24, size: int = 64, seed: int = 0) -> np.ndarray:
    """Frames that change over the episode (a block moving across a noisy background)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 60, size=(steps, size, size, 3), dtype=np.uint8)
    for t in range(steps):
        x = int((size - 12) * t / max(1, steps - 1))
        frames[t, 20:32, x : x + 12] = (220, 40, 40)
    return frames


def inline(frames: np.ndarray) -> dict:
    return InlineFrames.from_array(frames).model_dump(mode="json")


def audit_by_hand(scores: list[float], labels: list[bool], threshold: float) -> dict[str, float]:
    """The audit's numbers for a handful of episodes, computed the long way."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    bins: dict[int, list[tuple[float, bool]]] = {}
    for s, y in zip(scores, labels, strict=True):
        bins.setdefault(min(int(s * 10), 9), []).append((s, y))
    ece = sum(
        len(b) / len(scores) * abs(sum(s for s, _ in b) / len(b) - sum(y for _, y in b) / len(b)) for b in bins.values()
    )

    def quality(t: float) -> tuple[float, float, float]:
        tp = sum(s >= t for s in pos)
        fp = sum(s >= t for s in neg)
        acc = (tp + sum(s < t for s in neg)) / len(scores)
        f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if tp else 0.0
        return acc, f1, -t

    return {
        "episodes": len(scores),
        "auroc": wins / (len(pos) * len(neg)),
        "fpr": sum(s >= threshold for s in neg) / len(neg),
        "fnr": sum(s < threshold for s in pos) / len(pos),
        "ece": ece,
        "score_success": sum(pos) / len(pos),
        "score_failure": sum(neg) / len(neg),
        "best_threshold": max(scores, key=quality),
    }


def start_server(extra_flags: list[str], checkpoint: str, video_dir: Path, log_dir: Path) -> ServerProcess:
    flags = ["--config", str(CPU_PRESET), "--model-path", checkpoint, "--video-root", str(video_dir), *extra_flags]
    server = ServerProcess(flags, log_path=log_dir / f"server-{'-'.join(extra_flags[:2]) or 'default'}.log")
    server.start()
    try:
        server.wait_ready(600)
    except Exception:
        server.stop()
        raise
    return server


def _served(flags: list[str], checkpoint: str, video_dir: Path, tmp_path_factory):
    server = start_server(flags, checkpoint, video_dir, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_checkpoint, video_dir, tmp_path_factory):
    """The vllm engine with the Qwen profile; batches wait 300 ms so concurrent requests meet."""
    yield from _served(["--engine", "vllm", "--batch-wait-ms", "300"], tiny_checkpoint, video_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def hf_server(tiny_checkpoint, video_dir, tmp_path_factory):
    yield from _served(["--engine", "hf", "--batch-wait-ms", "300"], tiny_checkpoint, video_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def primo_hf_server(tiny_checkpoint, video_dir, tmp_path_factory):
    flags = ["--engine", "hf", "--backend", "PRIMO-R1", "--max-tokens", "8"]
    yield from _served(flags, tiny_checkpoint, video_dir, tmp_path_factory)
