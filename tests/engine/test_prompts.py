"""What reaches the engine: PRIMO-R1's official strings, exactly, in the official layout."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from reward_protocol.score import BackendKwargs
from reward_server.engines import EngineConfig
from reward_server.engines.vllm.engine import VllmEngine
from reward_server.profiles import load_profile
from tests.helpers.episodes import episode_frames, inline

DATA = Path(__file__).resolve().parents[1] / "data"
REFERENCE = json.loads((DATA / "primo_prompt_reference.json").read_text(encoding="utf-8"))
TASK = "put both the alphabet soup and the tomato sauce in the basket"


def official_primo_prompt(task: str) -> str:
    """The chat the released PRIMO-R1 saw, rebuilt from the reference strings (not the product's)."""
    question = REFERENCE["progress_question"].replace("{task_instruction}", task)
    user_text = (
        REFERENCE["question_template"].replace("{Question}", question).replace("{question_type}", "numerical")
        + REFERENCE["type_template_numerical"]
    )
    vision = "<|vision_start|>{}<|vision_end|>"
    return (
        f"<|im_start|>system\n{REFERENCE['system_prompt']}<|im_end|>\n"
        f"<|im_start|>user\n{vision.format('<|image_pad|>')}{vision.format('<|video_pad|>')}"
        f"{vision.format('<|image_pad|>')}{user_text}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_primo_prompt_and_media_order_as_prepared_for_vllm(tiny_checkpoint):
    profile = load_profile("PRIMO-R1")
    video = episode_frames(steps=8, size=56)
    request = profile.build(TASK, video, BackendKwargs(), "auto")
    engine = VllmEngine(EngineConfig(model_path=tiny_checkpoint))
    engine.load_processor()
    inputs, params = engine.prepare(request)
    assert inputs["prompt"] == official_primo_prompt(TASK)
    images = inputs["multi_modal_data"]["image"]
    ((frames, meta),) = inputs["multi_modal_data"]["video"]
    assert len(images) == 2
    np.testing.assert_array_equal(images[0], video[0])  # first frame before the video
    np.testing.assert_array_equal(images[1], video[-1])  # last frame after it
    np.testing.assert_array_equal(frames, video)
    assert meta["do_sample_frames"] is False and meta["total_num_frames"] == len(video)
    # official decoding
    assert params.top_p == pytest.approx(0.001) and params.temperature == pytest.approx(0.1)
    assert params.max_tokens == 4096


def test_primo_prompt_override_keeps_the_official_wrapping(tiny_checkpoint):
    profile = load_profile("PRIMO-R1")
    request = profile.build(TASK, episode_frames(4, 56), BackendKwargs(prompt="Did the robot finish: {task}?"), "auto")
    text = request.chat.user[-1].text
    assert text.startswith(f"QUESTION:\nDid the robot finish: {TASK}?\n\nQUESTION TYPE:\nnumerical\n")
    assert text.endswith(REFERENCE["type_template_numerical"])


def test_primo_prompt_through_the_server(primo_hf_server, video_dir):
    """The transformers engine behind a real server receives the same official prompt."""
    frames = episode_frames(steps=10, size=64)
    body = {"task_text": TASK, "frames": inline(frames), "backend_kwargs": {"return_prompt": True}}
    r = httpx.post(f"{primo_hf_server.url}/score", json=body, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["prompt"] == official_primo_prompt(TASK)
    assert data["backend"] == "PRIMO-R1"
    # random weights: a score only if a complete <answer> came out, else null with the reason
    if data["score"] is None:
        assert data["parse_status"] in ("missing_answer", "no_number", "multiple_numbers") and data["parse_error"]
    else:
        assert 0.0 <= data["score"] <= 1.0 and "</answer>" in data["model_output"]
    assert data["output_tokens"] <= 8
