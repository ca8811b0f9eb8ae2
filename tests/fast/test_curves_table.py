"""reward_tools.curves_table: the spread column that issue 40's goal (repeats within 10%) reads."""

from __future__ import annotations

import json

from reward_tools import curves_table


def report(walls: list[float]) -> dict:
    wall = sorted(walls)[len(walls) // 2]
    row = {"way": "curve", "k": 16, "n": 64, "wall_s": wall, "walls_s": walls, "over_k1": 3.0}
    return {"workload": {"style": "logprob"}, "rows": [{**row, "prompt_tokens": 10, "cached_tokens": 4, "errors": 0}]}


def test_the_spread_is_slowest_over_fastest(tmp_path):
    path = tmp_path / "curves_logprob_mine.json"
    path.write_text(json.dumps(report([5.0, 5.5, 5.2])))
    lines = curves_table.table([path]).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    row = dict(zip(header, cells, strict=True))
    assert row["setting"] == "mine"
    assert row["walls s"] == "5.00 5.50 5.20"
    assert row["spread"] == "10.0%"
    assert row["computed tokens"] == "6"


def test_one_repeat_has_no_spread():
    assert curves_table.spread([4.2]) == "-"
    assert curves_table.spread([1.0, 1.0]) == "0.0%"
