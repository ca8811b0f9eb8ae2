"""The parsing rules users rely on, table by table, through the same entry points the server uses."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from reward_protocol.score import ParseStatus
from reward_server.profiles import load_profile
from reward_server.profiles.parsing import logprob_score

OK, CLAMPED = ParseStatus.ok, ParseStatus.clamped
MISSING, NONUM, MULTI = ParseStatus.missing_answer, ParseStatus.no_number, ParseStatus.multiple_numbers

PRIMO_CASES = [
    # (model output, score_mode, expected score, expected status)
    ("<think>..</think><answer>85</answer>", "auto", 0.85, OK),
    ("<think>..</think><answer> 85% </answer>", "percentage", 0.85, OK),
    ("<answer>≈ 42.5</answer>", "auto", 0.425, OK),
    ("<answer>~70</answer>", "auto", 0.70, OK),
    ("<answer>1</answer>", "auto", 0.01, OK),  # "1" on a 0-100 scale is 1%, not success
    ("<answer>0.8</answer>", "unit", 0.8, OK),
    ("<answer>80</answer>", "unit", 1.0, CLAMPED),
    ("<answer>120</answer>", "auto", 1.0, CLAMPED),
    ("<answer>-5</answer>", "auto", 0.0, CLAMPED),
    ("<answer>30</answer> then <answer>90</answer>", "auto", 0.30, OK),  # the first complete answer
    # failures: never a number from the reasoning, never a keyword guess
    ("<think>step 3 of 4 done, about 75%</think>", "auto", None, MISSING),
    ("<think>step 3 of 4</think><answer>7", "auto", None, MISSING),  # truncated
    ("<answer>unsuccessful</answer>", "auto", None, NONUM),
    ("<answer>successful</answer>", "auto", None, NONUM),
    ("<answer>40-50</answer>", "auto", None, MULTI),
    ("<answer>3/4</answer>", "auto", None, MULTI),
    ("", "auto", None, MISSING),
]

QWEN_CASES = [
    ("85", "auto", 0.85, OK),
    ("85%", "percentage", 0.85, OK),
    ("The task is about 60% complete.", "auto", 0.60, OK),
    ("<answer>90</answer>", "auto", 0.90, OK),
    ("1", "auto", 0.01, OK),
    ("1", "unit", 1.0, OK),
    ("0.35", "unit", 0.35, OK),
    ("100", "auto", 1.0, OK),
    ("150", "auto", 1.0, CLAMPED),
    ("unsuccessful", "auto", None, NONUM),
    ("Yes", "auto", None, NONUM),
    ("step 3 of 4", "auto", None, MULTI),  # the seed read 0.04 here
    ("between 40 and 50", "auto", None, MULTI),
    ("<answer>", "auto", None, MISSING),
    ("<think>30</think><answer>", "auto", None, MISSING),
]


def _check(backend: str, text: str, mode: str, score: float | None, status: ParseStatus) -> None:
    result = load_profile(backend).parse_text(text, mode)
    assert result.status == status, (text, result)
    if score is None:
        assert result.score is None and result.error
    else:
        assert result.score == pytest.approx(score)
        assert 0.0 <= result.score <= 1.0


@pytest.mark.parametrize(("text", "mode", "score", "status"), PRIMO_CASES)
def test_primo_parsing(text, mode, score, status):
    _check("PRIMO-R1", text, mode, score, status)


@pytest.mark.parametrize(("text", "mode", "score", "status"), QWEN_CASES)
def test_qwen_progress_parsing(text, mode, score, status):
    _check("qwen2_5_vl_vllm", text, mode, score, status)


@pytest.mark.parametrize(
    ("lp_yes", "lp_no", "expected"),
    [
        (math.log(0.75), math.log(0.25), 0.75),
        (math.log(0.3), math.log(0.1), 0.75),  # renormalized over the two answers
        (-math.inf, 0.0, 0.0),
        (0.0, -math.inf, 1.0),
        (-1000.0, -1001.0, 1 / (1 + math.exp(-1))),  # no underflow far out in the tail
    ],
)
def test_logprob_score(lp_yes, lp_no, expected):
    result = logprob_score(lp_yes, lp_no)
    assert result.status == ParseStatus.logprob
    assert result.score == pytest.approx(expected)


def test_logprob_with_no_probability_is_a_failure():
    assert logprob_score(-math.inf, -math.inf).score is None


def test_auto_follows_the_profile_scale_and_logprob_is_refused_for_primo():
    qwen, primo = load_profile("qwen2_5_vl_vllm"), load_profile("primo_r1_vllm")
    assert qwen.parse_text("40", "auto").score == qwen.parse_text("40", "percentage").score == 0.4
    with pytest.raises(ValueError, match="logprob"):
        primo.check_score_mode("logprob")


@pytest.mark.parametrize(
    ("backend", "mode", "text", "score", "ok"),
    [
        ("PRIMO-R1", None, "<think>x</think><answer>64%</answer>", 0.64, True),
        ("primo_r1_vllm", "unit", "<answer>0.5</answer>", 0.5, True),
        ("qwen2_5_vl_vllm", None, "step 3 of 4", None, False),
    ],
)
def test_parse_cli_matches_server_rules(backend, mode, text, score, ok):
    cmd = [sys.executable, "-m", "reward_tools.parse", "--backend", backend]
    if mode:
        cmd += ["--score-mode", mode]
    out = subprocess.run(cmd, input=text, capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    assert data["ok"] is ok
    assert data["score"] == (pytest.approx(score) if score is not None else None)
    expected = load_profile(backend).parse_text(text, mode or "auto")
    assert data["parse_status"] == expected.status.value


def test_parse_cli_rejects_unknown_backend():
    proc = subprocess.run(
        [sys.executable, "-m", "reward_tools.parse", "--backend", "gpt"], input="1", capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "unknown backend 'gpt'" in proc.stderr and "PRIMO-R1" in proc.stderr
