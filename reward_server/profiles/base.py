"""A scoring profile: prompt + frame layout + sampling + parser, for one kind of judge model.

Profiles are engine-agnostic: `build` returns an `EngineRequest`, `parse` reads an
`EngineOutput`. `--backend` picks a profile; `--engine` picks what runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import numpy as np

from reward_protocol.frames import QWEN2_5_VL, FrameSpec
from reward_protocol.progress import prefix_ends
from reward_protocol.score import PROBABILITY_MODES, BackendKwargs, ScoreMode
from reward_server.engines.io import EngineOutput, EngineRequest, Part, Sampling, TextPart, VideoPart
from reward_server.profiles.parsing import (
    AnswerFormat,
    ParseResult,
    logprob_score,
    p_true_label,
    parse_answer,
    scale_for,
)
from reward_server.request_errors import FieldError


class UnsupportedOption(FieldError, ValueError):
    """A request asked a profile for something it cannot do (e.g. logprob on a reasoning model)."""


PartialGroups = Literal["tail", "shifted"]


@dataclass(frozen=True)
class SamplingDefaults:
    max_tokens: int
    temperature: float
    top_p: float


class Profile(ABC):
    name: str  # the canonical --backend name, returned in responses
    description: str
    answer_format: AnswerFormat
    prompt_scale: float = 100.0  # what number the built-in prompt asks for at full success
    score_modes: tuple[ScoreMode, ...] = ("auto", "percentage", "unit")
    default_score_mode: ScoreMode = "auto"
    sampling_defaults: SamplingDefaults
    fps: float = 2.0
    frame_spec: FrameSpec = QWEN2_5_VL  # the model's frame layout; the decoder and clients follow it
    logprob_words: tuple[str, str] = ("Yes", "No")  # logprob mode: (positive, negative) next-token answers
    # p_true mode (TOPReward's rule): the first token of the reply to a claim of completion. The
    # chat template ends the prompt with the assistant's header ("...assistant\n"), so the reply's
    # first token is the word without a leading space ("True", not " True").
    p_true_words: tuple[str, str] = ("True", "False")
    # whether each video item's frames carry their place in the episode (Qwen3-VL writes each frame
    # pair's timestamp into the prompt): a curve's clips then say where in the episode they begin
    episode_timestamps: bool = False

    def __init__(
        self,
        sampling: SamplingDefaults | None = None,
        default_score_mode: ScoreMode | None = None,
        max_tokens_limit: int | None = None,
        partial_groups: PartialGroups = "tail",
    ):
        if sampling is not None:
            self.sampling_defaults = sampling
        self.max_tokens_limit = max_tokens_limit
        self.partial_groups = partial_groups  # how build_curve shows a point that ends inside a frame group
        self._unavailable: dict[str, str] = {}  # score mode -> why this deployment cannot offer it
        if default_score_mode is not None:
            self.check_score_mode(default_score_mode)
            self.default_score_mode = default_score_mode

    def check_score_mode(self, score_mode: ScoreMode) -> None:
        if score_mode not in self.score_modes:
            raise UnsupportedOption(
                f"score_mode {score_mode!r} is not available for backend {self.name}; "
                f"allowed: {', '.join(self.score_modes)}"
            )
        if score_mode in self._unavailable:
            raise UnsupportedOption(self._unavailable[score_mode])

    def available_score_modes(self) -> list[str]:
        return [m for m in self.score_modes if m not in self._unavailable]

    def disable_score_mode(self, score_mode: ScoreMode, reason: str) -> None:
        """This deployment cannot offer score_mode (e.g. its tokenizer splits the answer words)."""
        if score_mode in self.score_modes:
            self._unavailable[score_mode] = reason

    def resolve_score_mode(self, kwargs: BackendKwargs) -> ScoreMode:
        mode = kwargs.score_mode or self.default_score_mode
        self.check_score_mode(mode)
        if kwargs.p_true_threshold is not None and mode != "p_true":
            raise UnsupportedOption(
                f"p_true_threshold applies to score_mode p_true only; this request's score_mode is {mode!r}",
                param="backend_kwargs.p_true_threshold",
            )
        return mode

    def answer_words(self, score_mode: ScoreMode) -> tuple[str, str]:
        """(positive, negative) next-token answers of a probability mode (logprob, p_true)."""
        return self.p_true_words if score_mode == "p_true" else self.logprob_words

    def sampling(self, kwargs: BackendKwargs, score_mode: ScoreMode) -> Sampling:
        if score_mode in PROBABILITY_MODES:
            # one prefill; the engine reads the two answers' next-token log-probabilities
            words = self.answer_words(score_mode)
            return Sampling(mode="logprob", max_tokens=1, temperature=0.0, top_p=1.0, candidates=words)
        d = self.sampling_defaults
        max_tokens = kwargs.max_tokens or d.max_tokens
        if self.max_tokens_limit is not None and max_tokens > self.max_tokens_limit:
            raise UnsupportedOption(
                f"max_tokens {max_tokens} exceeds this server's limit of {self.max_tokens_limit} (--max-tokens-limit)"
            )
        return Sampling(
            mode="generate",
            max_tokens=max_tokens,
            temperature=d.temperature if kwargs.temperature is None else kwargs.temperature,
            top_p=kwargs.top_p or d.top_p,
            ignore_eos=kwargs.ignore_eos,
        )

    def build(self, task_text: str, video: np.ndarray, kwargs: BackendKwargs, score_mode: ScoreMode) -> EngineRequest:
        """The engine request for one episode; video is [T, H, W, 3] uint8, already normalized."""
        return self.build_clips(task_text, [video], kwargs, score_mode)

    @abstractmethod
    def build_clips(
        self, task_text: str, clips: list[np.ndarray], kwargs: BackendKwargs, score_mode: ScoreMode
    ) -> EngineRequest:
        """The engine request that judges the frames of `clips`, consecutive pieces of one episode
        shown in order as separate video items. Everything before the question must depend only
        on the clips in order, so that one prefix's prompt is a prompt prefix of the next's (the
        engine's prefix cache reuses it). One clip is the plain request (`video` set)."""

    @abstractmethod
    def build_views(
        self, task_text: str, views: list[tuple[str, np.ndarray]], kwargs: BackendKwargs, score_mode: ScoreMode
    ) -> EngineRequest:
        """The engine request that judges one episode filmed by several cameras: `views` holds
        each camera's name and frames (the same moments, already normalized), in the order the
        model sees them. Each profile says how they reach its model."""

    def build_curve(
        self, task_text: str, video: np.ndarray, kwargs: BackendKwargs, score_mode: ScoreMode, points: int
    ) -> list[EngineRequest]:
        """One engine request per point of a progress curve, point k judging the frames
        [0, e_k), e_k = ceil(k*T/K) (reward_protocol.progress). The frames are cut into clips of the
        model's temporal group (pairs on Qwen2.5-VL), each a separate video item, and every point
        shows the first clips of a chain that longer points show too, so an engine with a prefix
        cache computes them once. A point that ends inside a group (`partial_groups`) shows:

        - "tail": the chain's clips up to its last whole group, and a tail of the point's own
          after them (the group's frames up to e_k, its last frame repeated), never reused:
          K = T costs T/2 extra groups, not a second copy of the episode;
        - "shifted": a second chain instead, one clip per group, grouped from the point's end
          backwards (its first clip the first frame repeated in front of the frames before the
          first whole group), which every point ending at the same place in a group shares. At
          K = T the same frames and as many clips as "tail", processed as one more chain
          instead of one tail per point (`reward_tools/benchmarks/input_processing.py --points 16
          --partial-groups shifted`: 15.5 and 14.5 ms a curve against 19.7 and 16.4 ms on one
          CPU thread); each point ends on a real pair of frames rather than a doubled one.

        A point that ends on a whole group shows the chain's clips up to it either way."""
        f = self.frame_spec.temporal_factor
        shared: list[np.ndarray] = []  # the chain, cut at each point's last whole group
        partial: dict[int, list[np.ndarray]] = {}  # "shifted": a chain per place inside a group
        start = 0
        requests = []
        for end in prefix_ends(len(video), points):
            whole = end - end % f
            if whole > start:
                shared.append(video[start:whole])
                start = whole
            if end == whole:
                clips = list(shared)
            elif self.partial_groups == "shifted":
                if end % f not in partial:
                    partial[end % f] = shifted_chain(video, end % f, f)
                clips = partial[end % f][: -(-end // f)]
            else:
                clips = [*shared, pad_frames(video[whole:end], f)]
            request = self.build_clips(task_text, clips, kwargs, score_mode)
            if self.episode_timestamps:
                shifted = self.partial_groups == "shifted" and end != whole
                request.video_starts = clip_starts(clips, (end % f - f) if shifted else 0)
            requests.append(request)
        return requests

    def parse(self, output: EngineOutput, score_mode: ScoreMode, kwargs: BackendKwargs | None = None) -> ParseResult:
        if score_mode in PROBABILITY_MODES:
            assert output.logprob_positive is not None and output.logprob_negative is not None
            result = logprob_score(output.logprob_positive, output.logprob_negative)
            if score_mode == "p_true":
                return p_true_label(result, kwargs.p_true_threshold if kwargs is not None else None)
            return result
        return self.parse_text(output.text, score_mode)

    def parse_text(self, text: str, score_mode: ScoreMode) -> ParseResult:
        return parse_answer(text, answer_format=self.answer_format, scale=scale_for(score_mode, self.prompt_scale))


def pad_frames(frames: np.ndarray, multiple: int) -> np.ndarray:
    """Frames padded to a multiple of `multiple` by repeating the last one (the model's grouping)."""
    short = -len(frames) % multiple
    if not short:
        return frames
    return np.concatenate([frames, np.repeat(frames[-1:], short, axis=0)])


def shifted_chain(video: np.ndarray, offset: int, group: int) -> list[np.ndarray]:
    """The clips of the points that end `offset` frames into a group (0: whole groups from the
    first frame): the frames before the first whole group, the first frame repeated in front of
    them to make a group, then every whole group after them."""
    head = [np.concatenate([np.repeat(video[:1], group - offset, axis=0), video[:offset]])] if offset else []
    return head + [video[s : s + group] for s in range(offset, len(video) - group + 1, group)]


def clip_starts(clips: list[np.ndarray], offset: int = 0) -> list[int]:
    """Where each of a curve's clips begins in the episode: clips follow each other, the first
    at `offset` (a "shifted" chain's first clip holds the first frame repeated in front of the
    frames before its first whole group, so it begins that many frames early; clamped at 0)."""
    starts, at = [], offset
    for clip in clips:
        starts.append(max(0, at))
        at += len(clip)
    return starts


def clip_request(clips: list[np.ndarray], **fields) -> EngineRequest:
    """An EngineRequest over these clips: one clip is the plain single-video request."""
    if len(clips) == 1:
        return EngineRequest(video=clips[0], **fields)
    return EngineRequest(video=None, clips=list(clips), **fields)


def view_parts(views: list[tuple[str, np.ndarray]]) -> tuple[Part, ...]:
    """One clip per view, each after a line naming its camera (the video items' order is the views')."""
    return tuple(part for name, _ in views for part in (TextPart(f"{name}:"), VideoPart()))


def fill_task(template: str, task_text: str) -> str:
    """Put the task into a prompt; only the literal '{task}' is replaced, other braces stay."""
    return template.replace("{task}", task_text.strip())
