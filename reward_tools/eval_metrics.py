"""Judge metrics of the offline evaluation tool.

The math lives in reward_client.judge_metrics (numpy only), shared with the live audit that
runs inside RLinf's env workers; the client may not import the server, so it cannot live here.
"""

from reward_client.judge_metrics import (
    CalibrationBin,
    Classification,
    JudgeSummary,
    auroc,
    best_threshold,
    calibration,
    classify_at,
    error_rates,
    mean_or_none,
    roc_curve,
    spearman,
    summarize_by_group,
    summarize_judge,
    value_order_correlation,
)

__all__ = [
    "CalibrationBin",
    "Classification",
    "JudgeSummary",
    "auroc",
    "best_threshold",
    "calibration",
    "classify_at",
    "error_rates",
    "mean_or_none",
    "roc_curve",
    "spearman",
    "summarize_by_group",
    "summarize_judge",
    "value_order_correlation",
]
