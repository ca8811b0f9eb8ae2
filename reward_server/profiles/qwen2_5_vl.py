"""Qwen2.5-VL-Instruct as a judge: a progress question (0-100), a yes/no claim for logprob scoring,
or a True/False statement of completion for p_true scoring (TOPReward's rule)."""

from __future__ import annotations

import numpy as np

from reward_protocol.score import BackendKwargs, ScoreMode
from reward_server.engines.io import ChatPrompt, EngineRequest, TextPart, VideoPart
from reward_server.profiles.base import Profile, SamplingDefaults, clip_request, fill_task, view_parts

PROGRESS_PROMPT = (
    "The video shows a robot arm working on this task: {task}\n"
    "How much of the task is done by the end of the video? Give the completion as a percentage "
    "from 0 (nothing done) to 100 (task fully completed).\n"
    "Answer with one number between 0 and 100 and nothing else."
)

# Asserting completion and asking for a verdict ranks episodes better than asking whether the
# task is complete (RLinf's TOPReward notes); the next token's P(Yes) vs P(No) is the score.
LOGPROB_PROMPT = (
    "The video shows a robot arm working on this task: {task}\n"
    "Claim: by the end of the video, the robot has fully completed the task.\n"
    "Is the claim correct? Answer Yes or No."
)

# TOPReward's rule (score_mode p_true): a statement that the task is completed, judged True or
# False; the reply's first token's P(True) / (P(True) + P(False)) is the score.
P_TRUE_PROMPT = (
    "The video shows a robot arm working on this task: {task}\n"
    "Statement: by the end of the video, the robot has completed the task.\n"
    "Is the statement True or False? Answer True or False."
)

# Several cameras: one clip per view, each after a line naming it, then the question about all of
# them (the same moments from each camera), in the same two forms.
VIEWS_PROGRESS_PROMPT = (
    "The videos above show one robot arm working on this task, each from one camera, at the same moments: {task}\n"
    "How much of the task is done by the end of the videos? Give the completion as a percentage "
    "from 0 (nothing done) to 100 (task fully completed).\n"
    "Answer with one number between 0 and 100 and nothing else."
)
VIEWS_LOGPROB_PROMPT = (
    "The videos above show one robot arm working on this task, each from one camera, at the same moments: {task}\n"
    "Claim: by the end of the videos, the robot has fully completed the task.\n"
    "Is the claim correct? Answer Yes or No."
)
VIEWS_P_TRUE_PROMPT = (
    "The videos above show one robot arm working on this task, each from one camera, at the same moments: {task}\n"
    "Statement: by the end of the videos, the robot has completed the task.\n"
    "Is the statement True or False? Answer True or False."
)

# the built-in question of each score mode: (one video or a curve's clips, several views)
PROMPTS: dict[str, tuple[str, str]] = {
    "logprob": (LOGPROB_PROMPT, VIEWS_LOGPROB_PROMPT),
    "p_true": (P_TRUE_PROMPT, VIEWS_P_TRUE_PROMPT),
}
PROGRESS_PROMPTS = (PROGRESS_PROMPT, VIEWS_PROGRESS_PROMPT)


class Qwen25VLProfile(Profile):
    name = "qwen2_5_vl_vllm"
    description = "Qwen2.5-VL-Instruct: video + progress prompt (0-100), yes/no logprob, or P(True)"
    answer_format = "plain"
    score_modes = ("auto", "percentage", "unit", "logprob", "p_true")
    sampling_defaults = SamplingDefaults(max_tokens=32, temperature=0.0, top_p=1.0)

    def build_clips(
        self, task_text: str, clips: list[np.ndarray], kwargs: BackendKwargs, score_mode: ScoreMode
    ) -> EngineRequest:
        # the clips of a curve's prefix follow each other as video items, the question after them
        template = kwargs.prompt or PROMPTS.get(score_mode, PROGRESS_PROMPTS)[0]
        user = (*(VideoPart() for _ in clips), TextPart(fill_task(template, task_text)))
        chat = ChatPrompt(system=kwargs.system_prompt, user=user)
        return clip_request(clips, chat=chat, sampling=self.sampling(kwargs, score_mode), fps=self.fps)

    def build_views(
        self, task_text: str, views: list[tuple[str, np.ndarray]], kwargs: BackendKwargs, score_mode: ScoreMode
    ) -> EngineRequest:
        template = kwargs.prompt or PROMPTS.get(score_mode, PROGRESS_PROMPTS)[1]
        chat = ChatPrompt(
            system=kwargs.system_prompt, user=(*view_parts(views), TextPart(fill_task(template, task_text)))
        )
        clips = [frames for _, frames in views]
        return clip_request(clips, chat=chat, sampling=self.sampling(kwargs, score_mode), fps=self.fps)
