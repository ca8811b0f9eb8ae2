"""The wire contract: seed bodies keep working, bad bodies are refused with a usable message."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from reward_protocol.score import BackendKwargs, BatchScoreRequest, InlineFrames, ScoreRequest
from tests.helpers.episodes import inline


def test_seed_body_is_accepted_unchanged():
    body = {
        "task_text": "open the drawer",
        "video_path": "/tmp/ep.mp4",
        "nframes": 16,
        "max_pixels": 200704,
        "backend": "qwen2_5_vl_vllm",
        "backend_kwargs": {"score_mode": "percentage"},
    }
    req = ScoreRequest.model_validate(body)
    assert req.video_path == "/tmp/ep.mp4" and req.backend_kwargs.score_mode == "percentage"


def test_seed_body_with_null_backend_kwargs():
    req = ScoreRequest.model_validate({"task_text": "t", "video_path": "/tmp/a.mp4", "backend_kwargs": None})
    assert req.backend_kwargs == BackendKwargs()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"task_text": "t"}, "exactly one of video_path, video_b64, frames"),
        ({"task_text": "t", "video_path": "/a", "video_b64": "AAAA"}, "got video_path, video_b64"),
        ({"task_text": "   ", "video_path": "/a"}, "task_text is blank"),
        ({"task_text": "t", "video_path": "/a", "nframes": 0}, "greater than or equal to 1"),
        ({"task_text": "t", "video_path": "/a", "backend_kwargs": {"score_mode": "binary"}}, "auto"),
        ({"task_text": "t", "video_path": "/a", "backend_kwargs": {"temprature": 0.1}}, "temprature"),
        ({"task_text": "t", "video_path": "/a", "max_pixels": 10}, "greater than or equal to 784"),
    ],
)
def test_bad_bodies_name_the_problem(body, fragment):
    with pytest.raises(ValidationError) as info:
        ScoreRequest.model_validate(body)
    assert fragment in str(info.value)


def test_inline_frames_round_trip_and_size_check():
    frames = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    payload = InlineFrames.model_validate(inline(frames))
    np.testing.assert_array_equal(np.frombuffer(payload.decode(), np.uint8).reshape(2, 4, 6, 3), frames)
    with pytest.raises(ValidationError, match="needs 216"):
        InlineFrames.model_validate({"shape": [3, 4, 6, 3], "data_b64": inline(frames)["data_b64"]})
    with pytest.raises(ValidationError, match="3 channels"):
        InlineFrames.model_validate({"shape": [2, 4, 6, 4], "data_b64": ""})


def test_empty_batch_is_refused():
    with pytest.raises(ValidationError, match="at least 1"):
        BatchScoreRequest.model_validate({"requests": []})
