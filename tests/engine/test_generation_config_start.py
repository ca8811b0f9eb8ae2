"""The vLLM engine's start on a checkpoint whose generation_config.json is bad (issue 58 class 8):
the same rule as every engine (tests/fast/test_generation_defaults.py). Before, vLLM started and
answered 500 naming no field on every chat request that left temperature unset, and an empty
file went unmentioned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reward_tools.launch import ServerFailed, ServerProcess
from tests.helpers.servers import CHAT, CPU_PRESET, post

SAY = [{"role": "user", "content": "say something"}]


def checkpoint_with(tiny_checkpoint: str, where: Path, text: str) -> Path:
    """The tiny checkpoint (its files linked) with `text` as its generation_config.json."""
    path = where / "ckpt"
    path.mkdir(parents=True)
    for item in Path(tiny_checkpoint).iterdir():
        if item.name != "generation_config.json":
            (path / item.name).symlink_to(item)
    (path / "generation_config.json").write_text(text)
    return path


def launch(path: Path, log: Path, *flags: str) -> ServerProcess:
    args = ["--config", str(CPU_PRESET), "--model-path", str(path), "--engine", "vllm", "--no-warmup", *flags]
    return ServerProcess(args, log_path=log).start()


def refused(path: Path, log: Path, *flags: str) -> str:
    """Start a server that must not become ready; its log."""
    server = launch(path, log, *flags)
    try:
        with pytest.raises(ServerFailed):
            server.wait_ready(600)
    finally:
        server.stop()
    return log.read_text(errors="replace")


def test_vllm_refuses_a_bad_default_at_start_and_warns_of_an_unreadable_file(tiny_checkpoint, tmp_path):
    # a default no request could send: refused before the model loads, naming the field and the range
    bad = checkpoint_with(tiny_checkpoint, tmp_path / "bad", json.dumps({"temperature": -1, "top_k": 1}))
    log = refused(bad, tmp_path / "bad.log")
    assert "generation_config.json sets temperature -1 (allowed: a number in [0, 2])" in log, log[-3000:]
    # an empty file: a warning naming it; vLLM serves with the neutral values
    empty = checkpoint_with(tiny_checkpoint, tmp_path / "empty", "")
    server = launch(empty, tmp_path / "empty.log")
    try:
        server.wait_ready(600)
        r = post(f"{server.url}{CHAT}", json={"messages": SAY, "max_tokens": 2}, timeout=300)
        assert r.status_code == 200, r.text
    finally:
        server.stop()
    log = (tmp_path / "empty.log").read_text(errors="replace")
    assert f"{empty / 'generation_config.json'} cannot be read as JSON" in log, log[-3000:]
    # vLLM's own overrides pass the same rule, before it builds an engine (no model load wasted)
    log = refused(empty, tmp_path / "override.log", "--engine-option", 'override_generation_config={"top_p": 7}')
    assert "override_generation_config sets top_p 7 (allowed: a number in (0, 1])" in log, log[-3000:]
    assert "vLLM engine arguments" not in log, log[-3000:]
