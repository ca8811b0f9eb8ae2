"""Scalars from a run's TensorBoard event files (RLinf's runner writes them under the run's
`tensorboard/`), for compare_runs.py, compare_audit.py and tiny_summary.py."""

from __future__ import annotations

from pathlib import Path


def event_dir(run_dir: Path) -> Path:
    tb = run_dir / "tensorboard"
    root = tb if tb.is_dir() else run_dir
    if not any(root.rglob("events.out.tfevents.*")):
        raise SystemExit(f"no TensorBoard event files under {run_dir} (RLinf writes them under the run's tensorboard/)")
    return root


def read_scalars(run_dir: Path, metrics: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] from every event file below the run's directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, dict[int, float]] = {m: {} for m in metrics}
    for events in sorted(event_dir(run_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for metric in metrics:
            if metric in acc.Tags().get("scalars", []):
                for event in acc.Scalars(metric):
                    series[metric][event.step] = event.value  # a resumed run's later value wins
    return {m: sorted(points.items()) for m, points in series.items()}
