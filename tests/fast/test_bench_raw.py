"""reward_tools.bench_raw on the transformers engine (the tiny checkpoint on CPU): the table and the
JSON a user compares the server with; vLLM's profiler flag refused where it cannot apply."""

from __future__ import annotations

import json

import pytest

from reward_tools import bench_raw


def test_hf_rows_and_json(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "raw.json"
    args = ["--engine", "hf", "--model-path", tiny_checkpoint, "--dtype", "float32", "--n", "3"]
    args += ["--styles", "logprob", "--repeats", "2", "--frames", "4", "--size", "64", "--out", str(out)]
    assert bench_raw.main(args) == 0
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["style"] == "logprob" and row["n"] == 3 and len(row["repeats_s"]) == 2
    assert row["wall_s"] > 0 and report["args"]["profile_dir"] is None
    assert "logprob" in capsys.readouterr().out


def test_profile_dir_is_for_vllm_only(tiny_checkpoint, tmp_path, capsys):
    args = ["--engine", "hf", "--model-path", tiny_checkpoint, "--profile-dir", str(tmp_path / "trace")]
    with pytest.raises(SystemExit) as exc:
        bench_raw.main([*args, "--out", str(tmp_path / "raw.json")])
    assert exc.value.code == 2 and "--engine vllm" in capsys.readouterr().err
    assert not (tmp_path / "raw.json").exists()
