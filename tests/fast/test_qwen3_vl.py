"""The Qwen3-VL profile and probability-of-done (p_true) scoring, through the entry points the
server uses: its frame rule, its parser, the p_true math and threshold, the curve's episode
timestamps, and the Qwen2.5-VL-only vLLM patches gated off for it."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from reward_protocol.frames import QWEN2_5_VL, QWEN3_VL
from reward_protocol.score import BackendKwargs, ParseStatus
from reward_server.engines.io import EngineOutput
from reward_server.engines.prompting import hf_video_metadata, video_metadata
from reward_server.engines.vllm.model_gates import applies_to, checkpoint_model_type, gate
from reward_server.engines.vllm.pixel_norm import METHOD as NORM_METHOD
from reward_server.engines.vllm.vision_mlp import METHOD as ALIGN_METHOD
from reward_server.profiles import UnsupportedOption, canonical_backend, load_profile
from reward_server.profiles.parsing import logprob_score, p_true_label

OK, MISSING, MULTI = ParseStatus.ok, ParseStatus.missing_answer, ParseStatus.multiple_numbers


def test_the_backend_is_known_by_its_names():
    assert canonical_backend("qwen3_vl") == canonical_backend("Qwen3-VL") == "qwen3_vl"
    profile = load_profile("qwen3-vl")
    assert profile.name == "qwen3_vl" and profile.frame_spec == QWEN3_VL
    assert "p_true" in profile.score_modes and "p_true" in load_profile("qwen2_5_vl").score_modes
    assert "p_true" not in load_profile("PRIMO-R1").score_modes  # a reasoning model: nothing read from one token


def test_frames_are_sized_to_qwen3s_grid():
    # patch 16 x merge 2: sides in multiples of 32 (Qwen2.5-VL's 28 would be resized again by the processor)
    assert QWEN3_VL.fit_size(256, 256, 256 * 28 * 28) == (256, 256)
    assert QWEN2_5_VL.fit_size(256, 256, 256 * 28 * 28) == (252, 252)
    h, w = QWEN3_VL.fit_size(480, 640, 200704)
    assert h % 32 == 0 and w % 32 == 0 and h * w <= 200704
    assert QWEN3_VL.fit_size(20, 20, 200704) == (64, 64)  # at least 2x2 merged patches
    assert QWEN3_VL.frame_count(7) == 8  # frames still in temporal pairs


@pytest.mark.parametrize(
    ("text", "score", "status"),
    [
        ("85", 0.85, OK),
        ("<think>step 3 of 4 done</think>80", 0.80, OK),  # the number after the reasoning
        ("the reasoning is here</think>\n70%", 0.70, OK),  # a Thinking template opens <think> itself
        ("<think>step 3 of 4, about 75", None, MISSING),  # truncated inside the reasoning: no guess
        ("<think>x</think>between 40 and 50", None, MULTI),
    ],
)
def test_qwen3_replies_are_read_after_their_reasoning(text, score, status):
    result = load_profile("qwen3_vl").parse_text(text, "auto")
    assert result.status == status, result
    assert result.score == (pytest.approx(score) if score is not None else None)


def test_p_true_is_the_normalized_probability_of_true():
    profile = load_profile("qwen3_vl")
    out = EngineOutput(logprob_positive=math.log(0.3), logprob_negative=math.log(0.1), finish_reason="length")
    result = profile.parse(out, "p_true", BackendKwargs(score_mode="p_true"))
    assert result.status == ParseStatus.logprob and result.score == pytest.approx(0.75)
    assert result.raw_value == pytest.approx(0.75)  # the probability, not the log-odds
    assert profile.parse(out, "logprob").raw_value == pytest.approx(math.log(3))


@pytest.mark.parametrize(("p", "label"), [(0.46, 1.0), (0.4599, 0.0), (0.9, 1.0), (0.0, 0.0)])
def test_a_threshold_turns_p_true_into_labels(p, label):
    lp_true = math.log(p) if p else -math.inf
    lp_false = math.log(1 - p)
    result = load_profile("qwen2_5_vl").parse(
        EngineOutput(logprob_positive=lp_true, logprob_negative=lp_false, finish_reason="length"),
        "p_true",
        BackendKwargs(score_mode="p_true", p_true_threshold=0.46),
    )
    assert result.score == label and result.raw_value == pytest.approx(p)


def test_a_failed_p_true_stays_a_failure_with_a_threshold():
    failed = logprob_score(math.nan, 0.0)
    assert p_true_label(failed, 0.46) is failed and failed.score is None


def test_p_true_asks_for_true_and_false_in_one_prefill():
    profile = load_profile("qwen3_vl")
    kwargs = BackendKwargs(score_mode="p_true")
    request = profile.build("put the bowl on the plate", np.zeros((4, 64, 64, 3), np.uint8), kwargs, "p_true")
    s = request.sampling
    assert (s.mode, s.max_tokens, s.candidates) == ("logprob", 1, ("True", "False"))
    text = request.chat.texts()[-1]
    assert "put the bowl on the plate" in text and "True or False" in text
    logprob = profile.build("t", np.zeros((4, 64, 64, 3), np.uint8), BackendKwargs(), "logprob")
    assert logprob.sampling.candidates == ("Yes", "No")
    views = profile.build_views("t", [("left", np.zeros((2, 64, 64, 3), np.uint8))] * 2, kwargs, "p_true")
    assert views.sampling.candidates == ("True", "False") and "True or False" in views.chat.texts()[-1]


def test_a_threshold_with_another_mode_is_refused_naming_the_field():
    profile = load_profile("qwen3_vl")
    with pytest.raises(UnsupportedOption, match="p_true only") as err:
        profile.resolve_score_mode(BackendKwargs(score_mode="logprob", p_true_threshold=0.5))
    assert err.value.param == "backend_kwargs.p_true_threshold"
    assert (
        load_profile("qwen3_vl", default_score_mode="p_true").resolve_score_mode(BackendKwargs(p_true_threshold=0.5))
        == "p_true"
    )
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        BackendKwargs(score_mode="p_true", p_true_threshold=1.5)


@pytest.mark.parametrize("partial", ["tail", "shifted"])
def test_a_curves_clips_carry_their_place_in_the_episode(partial):
    video = np.arange(10, dtype=np.uint8)[:, None, None, None] * np.ones((1, 64, 64, 3), np.uint8)
    profile = load_profile("qwen3_vl", partial_groups=partial)
    requests = profile.build_curve("t", video, BackendKwargs(score_mode="p_true"), "p_true", 5)
    for request in requests:
        clips = request.videos()
        assert len(request.video_starts) == len(clips)
        for start, clip in zip(request.video_starts, clips, strict=True):
            # each clip's frames are the episode's from its start (a group's padding repeats the last)
            real = clip[: min(len(clip), 10 - start)]
            if partial == "shifted" and start == 0 and clip[0, 0, 0, 0] == clip[1, 0, 0, 0] == 0 and len(clips) > 1:
                continue  # the shifted chain's head: the first frame repeated in front
            assert [int(f[0, 0, 0]) for f in real][:1] == [start], (partial, request.video_starts)
    # a prefix of a longer point keeps the same starts (the prefix cache still reuses it)
    assert requests[-1].video_starts[: len(requests[1].video_starts) - 1] == requests[1].video_starts[:-1]
    qwen25 = load_profile("qwen2_5_vl", partial_groups=partial).build_curve("t", video, BackendKwargs(), "logprob", 5)
    assert all(r.video_starts == [] for r in qwen25)  # Qwen2.5-VL's prompts are as before


def test_video_metadata_places_the_frames_in_time():
    meta = video_metadata(2, 2.0, start=8)
    assert meta["frames_indices"] == [8, 9] and meta["fps"] == 2.0 and meta["do_sample_frames"] is False
    assert "do_sample_frames" not in hf_video_metadata(2, 2.0, 8)  # transformers takes it as an argument
    assert video_metadata(4, 2.0) == {**video_metadata(4, 2.0, 0)}


def test_qwen2_5_only_worker_patches_stay_off_for_qwen3(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reward_server.engines.vllm.model_gates")
    for model_type, kept in [("qwen2_5_vl", [ALIGN_METHOD, NORM_METHOD, "x"]), ("qwen3_vl", ["x"]), (None, None)]:
        if model_type is not None:
            (tmp_path / model_type).mkdir()
            (tmp_path / model_type / "config.json").write_text(json.dumps({"model_type": model_type}))
            assert checkpoint_model_type(str(tmp_path / model_type)) == model_type
            assert gate([ALIGN_METHOD, NORM_METHOD, "x"], model_type) == kept
    assert checkpoint_model_type(str(tmp_path / "missing")) is None
    assert applies_to(ALIGN_METHOD, None) and applies_to(NORM_METHOD, None)  # unknown: as before the gate
    assert "stays off" in caplog.text and "qwen3_vl" in caplog.text


def test_rlinf_mains_api_config_with_qwen3_is_the_qwen2_5_one_but_for_the_judge():
    """configs/rlinf/main/maniskill_ppo_mlp_api_qwen3.yaml: RLinf's own example's judge
    (Qwen3-VL-4B-Instruct) in the API worker config the libero tier runs with Qwen2.5-VL."""
    main = Path(__file__).resolve().parents[2] / "configs" / "rlinf" / "main"

    def settings(name: str) -> list[str]:
        lines = (main / name).read_text().splitlines()
        return [line.split(" #")[0].rstrip() for line in lines if not line.lstrip().startswith("#")]

    base, qwen3 = settings("maniskill_ppo_mlp_api.yaml"), settings("maniskill_ppo_mlp_api_qwen3.yaml")
    changed = {(a.strip(), b.strip()) for a, b in zip(base, qwen3, strict=True) if a != b}
    assert changed == {
        ('experiment_name: "maniskill_ppo_mlp_api"', 'experiment_name: "maniskill_ppo_mlp_api_qwen3"'),
        ("model: Qwen2.5-VL-7B-Instruct", "model: Qwen3-VL-4B-Instruct"),
        ("model_path: /models/Qwen2.5-VL-7B-Instruct", "model_path: /models/Qwen3-VL-4B-Instruct"),
    }


def test_the_bench_has_a_p_true_style():
    from reward_tools.bench import style_kwargs

    assert style_kwargs("p_true").score_mode == "p_true" and style_kwargs("logprob").score_mode == "logprob"


def test_the_labeling_tool_follows_a_qwen3_servers_frame_rule(tmp_path):
    """reward_tools.label_episodes reads the frame rule from /health: against a qwen3_vl server
    (the fake engine: the server's machinery only) its frames reach the engine on the 32-pixel grid."""
    from reward_tools import label_episodes
    from tests.fast.test_label_episodes import PLAN, write_rlinf_episodes
    from tests.helpers.servers import InProcessServer

    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:2])
    with InProcessServer(backend="qwen3_vl") as server:
        args = ["--url", server.url, "--episodes", str(episodes), "--out", str(tmp_path / "out"), "--points", "3"]
        assert label_episodes.main([*args, "--nframes", "8", "--batch-size", "2"]) == 0
        seen = list(server.engine.seen)
    report = json.loads((tmp_path / "out" / "agreement.json").read_text())
    assert report["judge"]["backend"] == "qwen3_vl" and report["overall"]["episodes"] == 2
    sides = {side for request in seen for clip in request.videos() for side in clip.shape[1:3]}
    assert sides and all(side % 32 == 0 for side in sides), sides


def test_without_a_model_path_a_qwen3_server_serves_the_embedded_qwen3_checkpoint(tmp_path, monkeypatch):
    """`python -m reward_server --backend qwen3_vl` alone: the embedded random-weight checkpoint
    of its own family, not the Qwen2.5-VL one (a marker of the same settings: nothing is built)."""
    from dataclasses import asdict

    from reward_server.bootstrap import resolve
    from reward_server.settings import ServerSettings
    from reward_server.tiny_checkpoint import PRESETS

    monkeypatch.setenv("REWARD_SERVER_CACHE", str(tmp_path))
    built = tmp_path / "tiny-qwen3_vl"
    built.mkdir()
    (built / "config.json").write_text("{}")
    (built / "tiny_checkpoint.json").write_text(json.dumps({"seed": 0, **asdict(PRESETS["qwen3_vl"])}))
    assert resolve(ServerSettings(backend="qwen3-vl")).model_path == str(built)
