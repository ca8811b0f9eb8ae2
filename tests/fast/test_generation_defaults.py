"""A checkpoint's generation_config.json checked at start (issue 58 class 8), one rule for every
engine: a sampling default a chat request could not send refuses the start, naming the file, the
field and what is allowed; a file that cannot be read is a warning naming it. Before, vLLM
answered 500 on every chat request that left such a field unset and transformers sampled
greedily, and an unreadable file went unmentioned. Fast tier: the rule, and the real server
starting on the fake engine (which reads the checkpoint as the transformers engine does); the
vLLM engine's start is in tests/engine/test_chat_semantics.py."""

from __future__ import annotations

import json
import logging

import pytest

from reward_server.engines.generation_defaults import (
    InvalidGenerationConfig,
    allowed,
    check_overrides,
    checked_defaults,
)
from tests.helpers.servers import CHAT, InProcessServer, chat_body, get, post


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("temperature", -1, "temperature -1 (allowed: a number in [0, 2])"),
        ("top_p", 7, "top_p 7 (allowed: a number in (0, 1])"),
        ("top_p", 0, "top_p 0 (allowed: a number in (0, 1])"),
        ("top_k", -2, "top_k -2 (allowed: an integer in [-1, 1e+06])"),
        ("top_k", 1.5, "top_k 1.5"),
        ("temperature", "0.5", 'temperature "0.5"'),
        ("max_new_tokens", 0, "max_new_tokens 0 (allowed: an integer >= 1)"),
        ("max_new_tokens", True, "max_new_tokens true"),
        ("repetition_penalty", 0, "repetition_penalty 0 (allowed: a number in (0, 10])"),
        ("min_p", float("nan"), "min_p nan"),
    ],
)
def test_a_default_no_request_could_send_is_refused_naming_the_field_and_the_range(field, value, words):
    with pytest.raises(InvalidGenerationConfig) as exc:
        checked_defaults({"temperature": 0.1, field: value}, "ckpt/generation_config.json")
    message = str(exc.value)
    assert message.startswith("ckpt/generation_config.json sets ") and words in message, message


def test_defaults_a_request_could_send_pass_as_they_are():
    good = {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.05, "max_tokens": 3, "repetition_penalty": 1.05}
    assert checked_defaults(dict(good), "x") == good
    assert allowed("presence_penalty") == "a number in [-2, 2]"


def test_an_engine_override_is_held_to_the_same_rule_and_other_keys_pass():
    source = "--engine-option override_generation_config"
    with pytest.raises(InvalidGenerationConfig) as exc:
        check_overrides({"top_p": 7, "temperature": 0.5, "seed": "x"}, source)
    assert str(exc.value).startswith(f"{source} sets top_p 7 (allowed: a number in (0, 1])"), str(exc.value)
    check_overrides({"temperature": 0.2, "top_p": None, "seed": "x"}, source)  # null keeps the neutral value
    check_overrides(None, source)  # no override given
    check_overrides("not json", source)  # not an object: vLLM's own argument check refuses it


def checkpoint(tmp_path, text: str):
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / "generation_config.json").write_text(text)
    return path


def test_the_server_refuses_to_start_on_a_checkpoint_with_an_invalid_default(tmp_path):
    path = checkpoint(tmp_path, json.dumps({"temperature": -1, "top_p": 7, "top_k": 1}))
    with InProcessServer(model_path=str(path)) as s:
        assert s.service.status == "failed"
        health = get(f"{s.url}/health").json()
        detail = json.dumps(health)
        assert "temperature -1 (allowed: a number in [0, 2])" in detail, health
        assert "top_p 7 (allowed: a number in (0, 1])" in detail and "generation_config.json" in detail, health


@pytest.mark.parametrize("text", ["", "{not json", "\udcff"])
def test_an_unreadable_generation_config_is_a_warning_naming_the_file_and_sampling_stays_neutral(
    tmp_path, caplog, text
):
    path = checkpoint(tmp_path, "")
    (path / "generation_config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with caplog.at_level(logging.WARNING), InProcessServer(model_path=str(path)) as s:
        assert s.service.status == "ok"
        assert post(f"{s.url}{CHAT}", json=chat_body()).status_code == 200
        d = s.engine.seen[-1].sampling
        assert (d.temperature, d.top_p, d.top_k) == (1.0, 1.0, 0)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path / "generation_config.json") in m and "not applied" in m for m in warned), warned


def test_a_generation_config_that_is_not_an_object_refuses_the_start_naming_the_file(tmp_path):
    """A JSON list: transformers' reader raised a TypeError naming no file, and vLLM could not start."""
    path = checkpoint(tmp_path, "[1, 2]")
    with InProcessServer(model_path=str(path)) as s:
        assert s.service.status == "failed"
        assert "generation_config.json holds a JSON list, not an object" in s.service.detail
