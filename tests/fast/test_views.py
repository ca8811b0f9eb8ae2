"""Several camera views to the judge (`env.train.reward_model.views`), hook to engine, on the
real app with the fake engine (fast tier).

LIBERO's patched env hands the hook its observation (`main_images`, `wrist_images`); ManiSkill's
adapter reads `extra_view_images` [B, V, H, W, 3] (what StarVLA's wrapper also takes). Each view
is a clip of its own in one prompt, after a line naming its camera; the stand-in for ManiSkill's
env is tests/helpers/envs.py's. A two-clip prompt on a real engine is in tests/engine/test_views.py.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
from pydantic import ValidationError

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.env_adapters import ManiSkillAdapter
from reward_client.rlinf.hook import VLMRewardHook
from reward_protocol import raw_batch
from reward_protocol.frames import QWEN2_5_VL
from reward_protocol.score import InlineFrames, ScoreOptions, ScoreRequest, ViewFrames
from tests.helpers.envs import StandInManiskill, env_cfg
from tests.helpers.servers import InProcessServer

N, STEPS = 2, 5
TASKS = ["put the bowl on the plate", "open the drawer"]
PICKED = [10 * s for s in QWEN2_5_VL.pick_steps(STEPS + 1, 4)]  # main camera brightness of the frames sent


@pytest.fixture(scope="module")
def server():
    with InProcessServer() as s:
        yield s


def libero_obs(t: int) -> dict:
    """LIBERO's observation (torch, as main's LiberoEnv wraps it): the main camera at brightness
    10 * t, the wrist camera at 100 + 10 * t, so each clip shows which camera it came from."""
    main = torch.full((N, 28, 28, 3), 10 * t, dtype=torch.uint8)
    wrist = torch.full((N, 28, 28, 3), 100 + 10 * t, dtype=torch.uint8)
    return {"main_images": main, "wrist_images": wrist, "states": torch.zeros(N, 8), "task_descriptions": TASKS}


def run_libero(hook: VLMRewardHook) -> np.ndarray:
    hook.on_reset(None, libero_obs(0))
    for t in range(1, STEPS + 1):
        values = hook.on_step(libero_obs(t), TASKS, np.zeros(N, bool), np.full(N, t == STEPS), [0, 1])
    return values


def clip_labels(request) -> list[str]:
    return [text for text in request.chat.texts() if text.endswith(":") and "camera" in text]


@pytest.mark.parametrize("transport", ["raw", "inline"])
def test_two_views_reach_the_engine_as_two_named_clips(server, transport):
    config = RewardModelConfig(
        enable=True,
        url=server.url,
        nframes=4,
        wait_ready_s=30,
        views=["main_images", "wrist_images"],
        transport=transport,
    )
    seen = len(server.engine.seen)
    values = run_libero(VLMRewardHook(config, N))
    requests = server.engine.seen[seen:]
    assert len(requests) == N  # one prompt per episode, not one per view
    for request in requests:
        main, wrist = request.videos()
        assert clip_labels(request) == ["main camera:", "wrist camera:"]
        # the same moments of both cameras (first and last step included), each its own brightness
        assert [int(f.mean()) for f in main] == PICKED
        assert [int(f.mean()) for f in wrist] == [100 + b for b in PICKED]
        assert "from one camera" in request.chat.texts()[-1]
    # the fake engine scores the last clip's last frame: the wrist camera's
    np.testing.assert_allclose(values, 150 / 255, atol=0.01)


def test_one_view_requests_are_unchanged_on_the_wire(server):
    frames = np.zeros((4, 28, 28, 3), np.uint8)
    body = raw_batch.encode([(ScoreOptions(task_text="t"), frames)]).tobytes()
    header, _ = raw_batch.decode(body)
    entry = json.loads(body[8 : raw_batch.header_end(body)])["requests"][0]
    assert set(entry) == {"task_text", "frames"} and header.requests[0].views is None
    # and the default config sends one plain clip without a camera line
    seen = len(server.engine.seen)
    run_libero(VLMRewardHook(RewardModelConfig(enable=True, url=server.url, nframes=4, wait_ready_s=30), N))
    for request in server.engine.seen[seen:]:
        assert len(request.videos()) == 1 and clip_labels(request) == []
        assert [int(f.mean()) for f in request.videos()[0]] == PICKED


def test_maniskill_extra_view_images_give_one_clip_per_camera(server):
    cfg = env_cfg(server.url, views=["main_images", "extra_view_images"])
    adapter = ManiSkillAdapter(StandInManiskill(), cfg)
    n = adapter.num_envs

    def obs(t: int) -> dict:
        extra = torch.stack([torch.full((n, 28, 28, 3), 60 + v * 60 + t, dtype=torch.uint8) for v in range(2)], dim=1)
        return {"main_images": torch.full((n, 28, 28, 3), t, dtype=torch.uint8), "extra_view_images": extra}

    seen = len(server.engine.seen)
    adapter.on_reset(None, obs(0))
    for t in range(1, 4):
        done = torch.full((n,), t == 3)
        adapter.on_step(obs(t), {"success": done}, done, torch.zeros(n, dtype=torch.bool))
    requests = server.engine.seen[seen:]
    assert len(requests) == n
    for request in requests:
        assert clip_labels(request) == ["main camera:", "extra camera 0:", "extra camera 1:"]
        assert [int(v[-1].mean()) for v in request.videos()] == [3, 63, 123]


def test_views_are_checked_where_they_are_configured(server):
    with pytest.raises(ValidationError, match="unknown view 'left_images'"):
        RewardModelConfig(views=["main_images", "left_images"])
    with pytest.raises(ValidationError, match="transport raw or inline"):
        RewardModelConfig(views=["main_images", "wrist_images"], transport="video_path")
    with pytest.raises(ValidationError, match="a curve is drawn over one view"):
        RewardModelConfig(views=["main_images", "wrist_images"], progress_points=4)
    # a LIBERO patch that hands the hook main_images only cannot give a second camera
    config = RewardModelConfig(enable=True, url=server.url, wait_ready_s=30, views=["main_images", "wrist_images"])
    with pytest.raises(ValueError, match="re-apply the patches"):
        VLMRewardHook(config, N).on_reset(None, libero_obs(0)["main_images"].numpy())
    with pytest.raises(ValueError, match="has no wrist_images"):
        VLMRewardHook(config, N).on_reset(None, {"main_images": libero_obs(0)["main_images"]})


def test_the_server_refuses_views_that_do_not_show_the_same_moments(server):
    def views(*lengths: int) -> list[ViewFrames]:
        return [
            ViewFrames(name=f"camera {i}", frames=InlineFrames.from_array(np.zeros((t, 28, 28, 3), np.uint8)))
            for i, t in enumerate(lengths)
        ]

    with pytest.raises(ValidationError, match="same number of frames"):
        ScoreRequest(task_text="t", views=views(4, 6))
    body = {"requests": [{"task_text": "t", "views": [v.model_dump() for v in views(4, 6)]}]}
    answer = httpx.post(f"{server.url}/score/batch", json=body)  # that item's error (a JSON batch)
    [item] = answer.json()["results"]
    assert item["error"]["type"] == "invalid_request" and "same number of frames" in item["error"]["message"]
    two = {"a": np.zeros((4, 28, 28, 3), np.uint8), "b": np.zeros((2, 28, 28, 3), np.uint8)}
    raw = raw_batch.encode([(ScoreOptions(task_text="t"), two)])
    headers = {"content-type": raw_batch.CONTENT_TYPE}
    answer = httpx.post(f"{server.url}/score/batch", content=raw.tobytes(), headers=headers)
    assert answer.status_code == 422 and "same number of frames" in answer.text


def test_primo_r1_keeps_its_layout_with_a_named_clip_per_camera():
    from reward_protocol.score import BackendKwargs
    from reward_server.engines.io import ImagePart, TextPart, VideoPart
    from reward_server.profiles.primo_r1 import PrimoR1Profile

    main = np.stack([np.full((28, 28, 3), v, np.uint8) for v in (1, 2, 3, 4)])
    request = PrimoR1Profile().build_views(
        "open the drawer", [("main camera", main), ("wrist camera", main + 100)], BackendKwargs(), "auto"
    )
    kinds = [type(p).__name__ for p in request.chat.user]
    assert kinds == ["ImagePart", "TextPart", "VideoPart", "TextPart", "VideoPart", "ImagePart", "TextPart"]
    assert [p.text for p in request.chat.user if isinstance(p, TextPart)][:2] == ["main camera:", "wrist camera:"]
    assert isinstance(request.chat.user[0], ImagePart) and isinstance(request.chat.user[2], VideoPart)
    # the official first and last frames are the first camera's; the question is the official one
    assert [int(i.mean()) for i in request.images] == [1, 4] and len(request.videos()) == 2
    assert "open the drawer" in request.chat.user[-1].text and "<answer>" in request.chat.user[-1].text
