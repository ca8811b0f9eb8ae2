"""reward_tools.steps_report: a batch's phases cut from an engine step log (fast tier, no engine)."""

from __future__ import annotations

import json

from reward_tools.steps_report import main, phases, report


def _steps(start: float) -> list[dict]:
    """4 episodes arriving over 3 steps (their prompts done at steps 1-3), then 8 decode steps of 5 ms."""
    steps = [{"t": start + 0.10, "running": 1, "waiting": 3, "prefilled": 1, "new_tokens": 1}]
    steps.append({"t": start + 0.20, "running": 3, "waiting": 1, "prefilled": 2, "new_tokens": 3})
    steps.append({"t": start + 0.30, "running": 4, "waiting": 0, "prefilled": 1, "new_tokens": 4})
    for i in range(1, 9):
        steps.append(
            {"t": start + 0.30 + 0.005 * i, "running": 4, "waiting": 0, "new_tokens": 4, "finished": 4 * (i == 8)}
        )
    return steps


def test_phases_split_front_prefill_decode_tail():
    row = phases((10.0, 10.5), [{"t": 9.0, "new_tokens": 1}, *_steps(10.0), {"t": 11.0, "new_tokens": 1}])
    assert row["front_s"] == 0.1  # nothing in the engine before its first step
    assert row["prefill_s"] == 0.2  # until the last prompt's first token
    assert row["decode_s"] == 0.04  # 8 decode steps of 5 ms
    assert row["tail_s"] == 0.16
    assert row["decode_steps"] == 8 and row["step_ms"] == 5.0
    assert row["steps"] == 11 and row["max_waiting"] == 3  # steps outside the window are not counted


def test_goal_is_prefill_alone_plus_k_steps(tmp_path):
    bench = {
        "results": [
            {"path": "hook_raw", "style": "gen1", "n": 4, "wall_s": 0.4, "window": [10.0, 10.4], "stages": {}},
            {"path": "hook_raw", "style": "gen8", "n": 4, "wall_s": 0.5, "window": [20.0, 20.5], "stages": {}},
        ]
    }
    steps = _steps(10.0) + _steps(20.0)
    rows = report(bench, steps, decode_tokens=8)
    gen8 = rows[1]
    assert gen8["goal_s"] == 0.44  # 0.4 + 8 x 5 ms
    assert gen8["over_goal"] == round(0.5 / 0.44, 3)
    (tmp_path / "b.json").write_text(json.dumps(bench))
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(s) for s in steps))
    assert main([str(tmp_path / "b.json"), str(tmp_path / "s.jsonl"), "--decode-tokens", "8"]) == 0


def test_curves_give_one_row_per_repeat():
    curves = {"rows": [{"way": "curve", "k": 8, "n": 4, "windows": [[10.0, 10.5], [20.0, 20.5]]}]}
    rows = report(curves, _steps(10.0) + _steps(20.0), decode_tokens=256)
    assert [r["style"] for r in rows] == ["K=8 #1", "K=8 #2"]
    assert rows[1]["front_s"] == 0.1


def test_the_workers_timed_steps_of_each_batch_are_listed_from_its_start(tmp_path, capsys):
    """--timing: the worker's execute_model rows that began inside a row's batch, relative to its
    start, with their wall and CPU time and the collector's pauses, then the full collections in the
    worker's process during the batch; sample rows and rows of other batches are left out."""
    bench = {"results": [{"path": "hook_raw", "style": "logprob", "n": 4, "wall_s": 0.5, "window": [10.0, 10.5]}]}
    timing = [
        {
            "what": "execute",
            "t0": 9.5,
            "t1": 9.6,
            "cpu_ms": 90.0,
            "encoder_ms": 50.0,
            "encoder_calls": 1,
            "tokens": 700,
        },
        {
            "what": "execute",
            "t0": 10.05,
            "t1": 10.11,
            "cpu_ms": 55.0,
            "encoder_ms": 30.0,
            "encoder_calls": 1,
            "tokens": 718,
            "requests": 1,
            "new_requests": 1,
        },
        {"what": "sample", "t0": 10.11, "t1": 10.112, "cpu_ms": 1.5},
        {
            "what": "execute",
            "t0": 10.12,
            "t1": 10.32,
            "cpu_ms": 190.0,
            "encoder_ms": 120.0,
            "encoder_calls": 1,
            "tokens": 2100,
            "requests": 3,
            "new_requests": 3,
            "gc_ms": 24.5,
            "gc_full": 1,
        },
        {"what": "gc", "t0": 10.2, "t1": 10.2245, "collected": 12},
        {"what": "gc", "t0": 9.0, "t1": 9.03, "collected": 0},
    ]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(s) for s in _steps(10.0)))
    (tmp_path / "timing.jsonl").write_text("\n".join(json.dumps(t) for t in timing))
    main([str(tmp_path / "bench.json"), str(tmp_path / "steps.jsonl"), "--timing", str(tmp_path / "timing.jsonl")])
    out = capsys.readouterr().out
    assert "| 0.050 | 60.0 | 55.0 | 30.0 (1) | - | 718 | 1 (1) |" in out  # a file from before GC timing
    assert "| 0.120 | 200.0 | 190.0 | 120.0 (1) | 24.5 (1) | 2100 | 3 (3) |" in out
    # the full collection inside the batch, not the one before it
    assert "full collections in the worker's process: 1, 24.5 ms: 0.200 s (24.5 ms)" in out
    timed = [line for line in out.splitlines() if line.startswith("| -0.") or line.startswith("| 0.")]
    assert len(timed) == 2, timed  # the other batch's step and the sample row are left out


def test_a_curves_files_repeats_each_get_their_steps_and_a_summary(tmp_path, capsys):
    """--timing on reward_tools.bench_curves' output: every repeat's batch, by its own window, with
    a line that counts the steps that did work and those that found nothing to do."""
    curves = {"rows": [{"way": "curve", "k": 8, "n": 4, "windows": [[10.0, 10.5], [20.0, 20.4]]}]}

    def step(t0: float, tokens: int, requests: int, encoder_ms: float = 0.0) -> dict:
        return {
            "what": "execute",
            "t0": t0,
            "t1": t0 + 0.05,
            "cpu_ms": 40.0,
            "encoder_ms": encoder_ms,
            "encoder_calls": int(bool(encoder_ms)),
            "tokens": tokens,
            "requests": requests,
            "new_requests": requests,
            "gc_ms": 1.0,
            "gc_full": 0,
        }

    timing = [
        step(10.01, 1500, 8, 30.0),
        step(10.07, 0, 0),
        step(10.1, 2500, 16, 40.0),
        step(10.2, 0, 0),
        step(20.01, 4000, 32, 50.0),
    ]
    (tmp_path / "curves.json").write_text(json.dumps(curves))
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(s) for s in _steps(10.0) + _steps(20.0)))
    (tmp_path / "timing.jsonl").write_text("\n".join(json.dumps(t) for t in timing))
    main([str(tmp_path / "curves.json"), str(tmp_path / "steps.jsonl"), "--timing", str(tmp_path / "timing.jsonl")])
    out = capsys.readouterr().out
    assert "curve K=8 #1 N=4 (0.50 s): the worker's steps" in out and "curve K=8 #2 N=4 (0.40 s)" in out
    first, second = out.split("curve K=8 #2")
    assert "steps with work: 2, empty: 2; per working step (median) 12 requests, 2000 tokens; encoder 0.07 s" in first
    assert "steps with work: 1, empty: 0; per working step (median) 32 requests, 4000 tokens; encoder 0.05 s" in second


def test_feed_counts_the_prompts_the_engine_took_in_each_second_of_each_batch(tmp_path, capsys):
    """--feed: the prompts whose first step fell in each second of a batch (the last second partial),
    for every repeat of a curves file; steps outside a batch's window are not counted."""
    curves = {"rows": [{"way": "curve", "k": 16, "n": 64, "windows": [[10.0, 12.5], [20.0, 20.4]]}]}
    steps = [
        {"t": 9.9, "prefilled": 50},  # before the first batch
        {"t": 10.3, "prefilled": 1},
        {"t": 10.9, "prefilled": 10},
        {"t": 11.2, "prefilled": 20},
        {"t": 11.4, "new_tokens": 3},  # a step that took no prompt
        {"t": 12.2, "prefilled": 33},
        {"t": 20.1, "prefilled": 64},
    ]
    (tmp_path / "curves.json").write_text(json.dumps(curves))
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(s) for s in steps))
    assert main([str(tmp_path / "curves.json"), str(tmp_path / "steps.jsonl"), "--feed"]) == 0
    out = capsys.readouterr().out
    assert "- curve K=16 #1 N=64 (2.50 s): 11 20 33\n" in out
    assert "- curve K=16 #2 N=64 (0.40 s): 64\n" in out
