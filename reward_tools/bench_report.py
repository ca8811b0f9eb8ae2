"""One table from the JSON files of `reward_tools.bench_raw` and `reward_tools.bench` (same run).

    python -m reward_tools.bench_report raw_vllm.json server_vllm.json peer_vllm_serve.json
    python -m reward_tools.bench_report ray_1.json ray_2.json list_2.json     (reward_tools.bench_clients)

Files of `reward_tools.bench_clients` make a table of their own: one row per file, client count
and style, with the speed-up against the first file's row of the same client count and style.

Each row: path, style, N, episodes/s, wall time, and the time against the bare engine's on the
same style and N (1.00 = engine speed; from the first raw file given), plus the server's mean
per-episode stage timings where the row has them. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(paths: list[str]) -> list[dict]:
    out = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if "engine" in data and "launch" not in data:  # bench_raw
            for r in data["results"]:
                out.append({"path": f"bare engine ({data['engine']})", **r, "stages": {}})
            continue
        label = Path(path).stem
        for r in data["results"]:
            name = r["path"] if r["path"] != "peer" else "vllm serve (peer)"
            out.append({**r, "path": f"{name}" + ("" if r["path"] == "peer" else f" [{label}]")})
    return out


def table(all_rows: list[dict]) -> str:
    bare = {(r["style"], r["n"]): r["wall_s"] for r in all_rows if r["path"].startswith("bare engine")}
    lines = [
        "| path | style | N | eps/s | wall s | x bare engine | receive ms | prepare ms | engine ms | total ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in all_rows:
        ref = bare.get((r["style"], r["n"]))
        ratio = f"{r['wall_s'] / ref:.2f}" if ref else "-"
        st = r.get("stages") or {}
        cells = [f"{st[k]:.0f}" if k in st else "-" for k in ("receive_ms", "prepare_ms", "engine_ms", "total_ms")]
        lines.append(
            f"| {r['path']} | {r['style']} | {r['n']} | {r['episodes_per_s']:.2f} | {r['wall_s']:.2f} | {ratio} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def clients_table(paths: list[str]) -> str:
    """bench_clients files: each row against the first file's row with the same clients and style."""
    lines = [
        "| setup | replicas | style | clients | episodes | wall s | eps/s | x first |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple, float] = {}
    for path in paths:
        for r in json.loads(Path(path).read_text())["results"]:
            key = (r["clients"], r["style"], r["n_per_client"])
            base.setdefault(key, r["episodes_per_s"])
            lines.append(
                f"| {Path(path).stem} | {r['replicas']} | {r['style']} | {r['clients']} | {r['episodes']} | "
                f"{r['wall_s']:.2f} | {r['episodes_per_s']:.2f} | {r['episodes_per_s'] / base[key]:.2f} |"
            )
    return "\n".join(lines)


def _is_clients_file(path: str) -> bool:
    results = json.loads(Path(path).read_text()).get("results") or [{}]
    return "clients" in results[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reward_tools.bench_report", description=__doc__)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    clients = [f for f in args.files if _is_clients_file(f)]
    others = [f for f in args.files if f not in clients]
    tables = ([table(rows(others))] if others else []) + ([clients_table(clients)] if clients else [])
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
