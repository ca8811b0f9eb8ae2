"""Qwen3-VL-Instruct (2B-8B dense) as a judge: the Qwen2.5-VL questions on Qwen3-VL's frame rule.

What differs from Qwen2.5-VL is the model's, not the question's:
- frames: patch 16 with a 2x2 merge, so sides are multiples of 32 (reward_protocol.frames.QWEN3_VL),
  still in temporal pairs;
- time: the processor writes each frame pair's timestamp ("<1.5 seconds>") into the prompt from
  the video's metadata (fps, frame indices), so a curve's clips carry where in the episode they
  begin (`episode_timestamps`) and read as one timeline rather than each starting at 0 s;
- replies: a Thinking checkpoint (or an Instruct one prompted to reason) answers after a
  `<think>...</think>` block; the number is read after it, and an unclosed block is a truncated
  answer, never a number picked out of the reasoning.
The prompts, the score modes (progress, logprob, p_true) and the views are Qwen2.5-VL's.
"""

from __future__ import annotations

import re

from reward_protocol.frames import QWEN3_VL
from reward_protocol.score import ParseStatus, ScoreMode
from reward_server.profiles.parsing import ParseResult
from reward_server.profiles.qwen2_5_vl import Qwen25VLProfile

_THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>", re.DOTALL)


class Qwen3VLProfile(Qwen25VLProfile):
    name = "qwen3_vl"
    description = "Qwen3-VL-Instruct: video + progress prompt (0-100), yes/no logprob, or P(True)"
    frame_spec = QWEN3_VL
    episode_timestamps = True

    def parse_text(self, text: str, score_mode: ScoreMode) -> ParseResult:
        match = _THINK.match(text)
        if match:
            text = text[match.end() :]
        elif "<think>" in text:
            return ParseResult(
                None, ParseStatus.missing_answer, error="the <think> block is never closed (output truncated?)"
            )
        return super().parse_text(text, score_mode)
