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


def two_views(server, **options) -> RewardModelConfig:
    """The hook's config for LIBERO's main and wrist cameras."""
    common = {"enable": True, "url": server.url, "nframes": 4, "wait_ready_s": 30}
    return RewardModelConfig(**common, views=["main_images", "wrist_images"], **options)


def clip_labels(request) -> list[str]:
    return [text for text in request.chat.texts() if text.endswith(":") and "camera" in text]


@pytest.mark.parametrize("transport", ["raw", "inline"])
def test_two_views_reach_the_engine_as_two_named_clips(server, transport):
    config = two_views(server, transport=transport)
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


# --- views that cannot collapse (issue 58, class 6) ----------------------------------------------


@pytest.mark.parametrize(
    ("views", "why"),
    [
        (["extra_view_images[0]", "extra_view_images[00]"], "'extra_view_images[0]' and 'extra_view_images[00]' are"),
        (["main_images", "extra_view_images[0]", "extra_view_images[00]"], "both extra_view_images[0]"),
        (["extra_view_images", "extra_view_images[0]"], "stands for each of its cameras"),
        (["main_images", " main_images"], "both main_images"),
    ],
)
def test_one_camera_named_twice_is_refused_in_the_config(views, why):
    """Before: these passed the config check and collapsed to fewer cameras (a 422 for the whole
    raw batch, a ValidationError out of the hook inline, or a camera dropped silently)."""
    with pytest.raises(ValidationError, match=r"name each camera once|name either extra_view_images") as caught:
        RewardModelConfig(views=views)
    assert why in str(caught.value)


def test_view_names_are_normalized_in_the_config():
    config = RewardModelConfig(views=[" extra_view_images[01] ", "main_images"])
    assert config.views == ["extra_view_images[1]", "main_images"]


def libero_sized(t: int, wrist: int) -> dict:
    obs = libero_obs(t)
    obs["wrist_images"] = torch.full((N, wrist, wrist, 3), 100 + 10 * t, dtype=torch.uint8)
    return obs


def run_resized(hook: VLMRewardHook) -> np.ndarray:
    """env 1 ends at step 2; then the wrist camera's frames grow from 28 to 56 pixels, and env 0
    ends at step 5."""
    hook.on_reset(None, libero_sized(0, 28))
    for t in range(1, STEPS + 1):
        obs = libero_sized(t, 28 if t <= 2 else 56)
        values = hook.on_step(obs, TASKS, np.zeros(N, bool), np.array([t == STEPS, t == 2]), [0, 1])
    return values


@pytest.mark.parametrize("transport", ["raw", "inline"])
def test_a_camera_that_changes_size_mid_episode_is_a_counted_fallback(server, transport):
    """Before: the camera's earlier frames were dropped (its clip had fewer frames than the
    other's), and the request failed: a ValidationError out of the hook inline, whatever
    fail_on_request_error said; a 422 for the whole batch over raw."""
    hook = VLMRewardHook(two_views(server, transport=transport, fail_on_request_error=False), N)
    seen = len(server.engine.seen)
    values = run_resized(hook)
    assert len(server.engine.seen) - seen == 1  # env 1's episode, judged before the change
    assert hook.counts["view_errors"] == 1 and hook.counts["fallbacks"] == 1 and hook.counts["scored"] == 1
    info = hook.episode_info()
    assert info["vlm_fallback"].tolist() == [1.0, 0.0] and values[0] == 0.0 and values[1] > 0
    # with fail_on_request_error (the default) the run stops, saying what happened
    hook = VLMRewardHook(two_views(server, transport=transport), N)
    with pytest.raises(RuntimeError, match=r"wrist camera frames changed size mid-episode, \[28, 28, 3\] to \[56"):
        run_resized(hook)


def test_a_camera_count_that_changes_is_a_fallback_and_a_new_epoch_takes_the_new_cameras(server):
    """ManiSkill's extra_view_images grows from 2 to 3 cameras mid-episode (before: "zip()
    argument 2 is longer than argument 1" out of on_step). The episodes that saw the change are
    counted fallbacks; the next rollout epoch, reset with 3 cameras, is judged with all of them."""
    cfg = env_cfg(server.url, views=["main_images", "extra_view_images"], fail_on_request_error=False)
    adapter = ManiSkillAdapter(StandInManiskill(), cfg)
    n = adapter.num_envs

    def obs(t: int, cameras: int) -> dict:
        extra = torch.stack([torch.full((n, 28, 28, 3), 60 + v + t, dtype=torch.uint8) for v in range(cameras)], 1)
        return {"main_images": torch.full((n, 28, 28, 3), t, dtype=torch.uint8), "extra_view_images": extra}

    def epoch(cameras_at) -> None:
        adapter.on_reset(None, obs(0, cameras_at(0)))
        for t in range(1, 4):
            done = torch.full((n,), t == 3)
            adapter.on_step(obs(t, cameras_at(t)), {"success": done}, done, torch.zeros(n, dtype=torch.bool))

    seen = len(server.engine.seen)
    epoch(lambda t: 2 if t < 2 else 3)
    hook = adapter.hook
    assert len(server.engine.seen) == seen and hook.counts["view_errors"] == n and hook.counts["fallbacks"] == n
    epoch(lambda t: 3)
    requests = server.engine.seen[seen:]
    assert len(requests) == n and hook.counts["scored"] == n
    assert all(clip_labels(r) == ["main camera:", *(f"extra camera {v}:" for v in range(3))] for r in requests)


@pytest.mark.parametrize("transport", ["raw", "inline"])
def test_canary_probes_show_every_camera_of_the_episode(server, transport):
    """Before: probes were made of the first view alone, so a multi-view judge's probe scores
    were not comparable with its episodes'."""
    config = two_views(server, transport=transport, canary_fraction=1.0, canary_kinds=["static", "reversed"])
    seen = len(server.engine.seen)
    hook = VLMRewardHook(config, N)
    run_libero(hook)
    requests = server.engine.seen[seen:]
    assert len(requests) == 3 * N and hook.counts["canaries"] == 2 * N
    firsts = {"static": [PICKED[0]] * 4, "reversed": PICKED[::-1], "real": PICKED}
    shown = sorted(tuple(int(f.mean()) for f in r.videos()[0]) for r in requests)
    assert shown == sorted(tuple(v) for v in firsts.values() for _ in range(N))
    for request in requests:
        main, wrist = request.videos()
        assert clip_labels(request) == ["main camera:", "wrist camera:"]
        assert [int(f.mean()) for f in wrist] == [100 + int(f.mean()) for f in main]  # the same moments, changed alike


@pytest.mark.parametrize("name", ["   ", "main\ncamera", "main camera\r", "tab\tcamera"])
def test_a_view_name_that_is_not_one_printable_line_is_refused(server, name):
    """Before: names of only whitespace, or with line breaks, reached the prompt."""
    frames = np.zeros((4, 28, 28, 3), np.uint8)
    with pytest.raises(ValidationError, match=r"blank|line break"):
        ScoreRequest(
            task_text="t",
            views=[ViewFrames(name=v, frames=InlineFrames.from_array(frames)) for v in (name, "wrist camera")],
        )
    raw = raw_batch.encode([(ScoreOptions(task_text="t"), {name: frames, "wrist camera": frames})])
    answer = httpx.post(
        f"{server.url}/score/batch", content=raw.tobytes(), headers={"content-type": raw_batch.CONTENT_TYPE}
    )
    assert answer.status_code == 422 and ("blank" in answer.text or "line break" in answer.text), answer.text
