"""Turning a model's answer into a score in [0, 1].

Rules (the README's "Scoring semantics" section states them for users):
- `percentage`: value / 100; `unit`: value as is; `auto`: the scale the profile's prompt asks
  for (0-100 for both built-in progress prompts); `logprob`: P(yes) / (P(yes) + P(no)).
- `tagged` answers (PRIMO-R1): the number inside the first complete <answer>...</answer>.
  No complete tag, or no number inside it, is a failure; numbers in the reasoning are ignored.
- `plain` answers (Qwen progress): the reply, or its <answer> if it has one, must hold exactly
  one number. An <answer> that is opened but never closed is a failure (truncated output).
- `logprob`: a NaN or +inf log-probability is a failure (`invalid_logprob`), never a score.
- `%`, `≈`, `~` around the number are allowed. Zero or several numbers is a failure.
- Values outside the scale are clamped to [0, 1] and reported as `clamped`.
A failure gives score None with a status and a message; nothing is guessed from keywords.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from reward_protocol.score import ParseStatus, ScoreMode

AnswerFormat = Literal["tagged", "plain"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


@dataclass(frozen=True)
class ParseResult:
    score: float | None
    status: ParseStatus
    raw_value: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.score is not None


def scale_for(score_mode: ScoreMode, prompt_scale: float) -> float:
    """The number that maps to a score of 1.0 under score_mode."""
    if score_mode == "percentage":
        return 100.0
    if score_mode == "unit":
        return 1.0
    if score_mode == "auto":
        return prompt_scale
    raise ValueError(f"score_mode {score_mode!r} does not parse text")


def _answer_segment(text: str, answer_format: AnswerFormat) -> tuple[str | None, str | None]:
    match = _ANSWER.search(text)
    if match:
        return match.group(1), None
    if answer_format == "tagged":
        if "<answer>" in text:
            return None, "the <answer> tag is never closed (output truncated?)"
        return None, "no <answer>...</answer> in the output"
    if "<answer>" in text:
        return None, "the <answer> tag is never closed (output truncated?)"
    return text, None


def parse_answer(text: str, *, answer_format: AnswerFormat, scale: float) -> ParseResult:
    segment, problem = _answer_segment(text, answer_format)
    if segment is None:
        return ParseResult(None, ParseStatus.missing_answer, error=problem)
    numbers = _NUMBER.findall(segment)
    where = "the answer" if segment is not text else "the reply"
    if not numbers:
        return ParseResult(None, ParseStatus.no_number, error=f"no number in {where}: {_clip(segment)!r}")
    if len(numbers) > 1:
        return ParseResult(
            None,
            ParseStatus.multiple_numbers,
            error=f"{len(numbers)} numbers in {where} ({', '.join(numbers[:5])}); expected exactly one",
        )
    value = float(numbers[0])
    score, status = clamp(value / scale)
    return ParseResult(score, status, raw_value=value)


def clamp(score: float) -> tuple[float, ParseStatus]:
    if math.isnan(score):
        return 0.0, ParseStatus.clamped
    if score < 0.0:
        return 0.0, ParseStatus.clamped
    if score > 1.0:
        return 1.0, ParseStatus.clamped
    return score, ParseStatus.ok


def logprob_score(logprob_yes: float, logprob_no: float) -> ParseResult:
    """P(yes) / (P(yes) + P(no)) from the two next-token log-probabilities (either may be -inf).
    A NaN or +inf (a numerical fault in the engine: no probability is either) is a failure with
    its reason, never a score: NaN would otherwise pass through max() and exp() into the answer."""
    pair = (("positive", logprob_yes), ("negative", logprob_no))
    bad = [(word, v) for word, v in pair if math.isnan(v) or v == math.inf]
    if bad:
        detail = ", ".join(f"the {word} answer's is {v!r}" for word, v in bad)
        error = f"the engine gave an invalid log-probability: {detail}"
        return ParseResult(None, ParseStatus.invalid_logprob, error=error)
    top = max(logprob_yes, logprob_no)
    if top == -math.inf:
        return ParseResult(None, ParseStatus.no_number, error="the engine gave neither answer token any probability")
    p_yes = math.exp(logprob_yes - top)
    p_no = math.exp(logprob_no - top)
    return ParseResult(p_yes / (p_yes + p_no), ParseStatus.logprob, raw_value=logprob_yes - logprob_no)


def p_true_label(result: ParseResult, threshold: float | None) -> ParseResult:
    """score_mode p_true: the probability P(True) / (P(True) + P(False)) as the score, or with a
    threshold a 0/1 label (1.0 at or above it); raw_value is the probability either way."""
    if result.score is None:
        return result
    score = result.score if threshold is None else float(result.score >= threshold)
    return ParseResult(score, result.status, raw_value=result.score)


def _clip(text: str, limit: int = 80) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."
