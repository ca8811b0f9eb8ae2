"""PRIMO-R1 profile: the released checkpoint's own prompt, layout and decoding.

The strings below are the model's input interface (PRIMO-R1 official prompts, Apache-2.0),
reproduced exactly: the checkpoint was trained on them, and tests compare them to a
reference copy. They live here and nowhere else.
"""

from __future__ import annotations

import numpy as np

from reward_protocol.score import BackendKwargs, ScoreMode
from reward_server.engines.io import ChatPrompt, EngineRequest, ImagePart, TextPart, VideoPart
from reward_server.profiles.base import Profile, SamplingDefaults, clip_request, fill_task, view_parts

PRIMO_SYSTEM_PROMPT = """A conversation between User and Assistant. The Assistant is an expert AI specializing in embodied procedure and event reasoning based on visual input (video or images). The assistant must strictly follow a specific thought process and output format. The reasoning process is enclosed within <think> </think> tags, and the final answer is within <answer> </answer> tags. The <think> block must contain three ordered subsections: <planning>, <observation>, and <reasoning>. The <answer> block must contain only the final output required by the question type and no other commentary."""

PRIMO_QUESTION_TEMPLATE = (
    "QUESTION:\n"
    "{Question}\n"
    "\n"
    "QUESTION TYPE:\n"
    "{question_type}\n"
    "\n"
    "Analyze the provided visual data and reason about the ongoing task.\n"
    "\n"
    "Please think about this question as if you were a human pondering deeply. Provide your detailed reasoning between the <think> and </think> tags, following the subsections <planning>, <observation>, and <reasoning>. Then give your final answer between the <answer> and </answer> tags.\n"
    "\n"
    "Below is the required template:\n"
    "\n"
    "<think>\n"
    "<planning>\n"
    "Identify the high-level goal of the agent, what is the initial state? What does successful completion look like?\n"
    "Break down the high-level goal into a logical sequence of canonical steps. This serves as your mental plan for interpreting the task.\n"
    "Use this plan to interpret actions, map observed behaviors to steps, assess progress, detect anomalies, and predict what happens next.\n"
    "</planning>\n"
    "<observation>\n"
    "View the video as a temporal sequence of actions contributing to the procedure.\n"
    "Objectively describe what is occurring in the current moment, noting evidence of progress or state changes.\n"
    "Identify fine-grained actions and explain how they move the task forward.\n"
    "List relevant objects, tools, and environmental context, emphasizing functional states and transformations.\n"
    "Note cues—repetition, transitions, or completion indicators—that situate the action in the procedural script.\n"
    "</observation>\n"
    "<reasoning>\n"
    "Think through the question as a human would, Engage in an internal dialogue using expressions such as 'let me think', 'wait', 'hmm', 'oh, I see', 'let's break it down', etc.\n"
    "Connect observations to the procedural plan to determine which step is being executed, progress, correctness, or anomalies.\n"
    "Reflect on assumptions, verify interpretations, and, if appropriate, predict the agent's next likely action.\n"
    "Synthesize understanding of what the agent is doing, how it fits into the broader task, and whether the process seems successful.\n"
    "You are encouraged to include self-reflection or verification in your reasoning process.\n"
    "</reasoning>\n"
    "</think>\n"
    "<answer>\n"
    "[Final answer here — strictly follow the `{question_type}` output format and include no extra commentary.]\n"
    "</answer>"
)

PRIMO_TYPE_TEMPLATE_NUMERICAL = (
    " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags."
)

# The question the seed deployment asked for episode progress (task instruction first).
PRIMO_PROGRESS_QUESTION = (
    "Task info:\n"
    "{task_instruction}\n"
    "\n"
    "Question:\n"
    "Given the task goal and the input video, estimate the current task completion percentage (0-100). The estimation must reflect progress toward the final goal rather than scene description."
)


def primo_user_text(question: str) -> str:
    """The user turn's text exactly as PRIMO-R1 was trained on it, for a numerical question."""
    return PRIMO_QUESTION_TEMPLATE.format(Question=question, question_type="numerical") + PRIMO_TYPE_TEMPLATE_NUMERICAL


class PrimoR1Profile(Profile):
    """PRIMO-R1-7B: system prompt, [first frame, video, last frame, question], <answer>0-100</answer>.

    Decoding follows the official evaluation (temperature 0.1, top_p 0.001, up to 4096 new
    tokens); a larger top_p garbles the reasoning. A `prompt` override replaces the question,
    and the official template still wraps it.
    """

    name = "PRIMO-R1"
    description = "PRIMO-R1-7B: official prompt, first frame + video + last frame, <answer> 0-100"
    answer_format = "tagged"
    score_modes = ("auto", "percentage", "unit")
    sampling_defaults = SamplingDefaults(max_tokens=4096, temperature=0.1, top_p=0.001)

    def _question(self, task_text: str, kwargs: BackendKwargs) -> tuple[str, str]:
        """(system prompt, the user turn's text) for this task."""
        question = (
            fill_task(kwargs.prompt, task_text)
            if kwargs.prompt
            else PRIMO_PROGRESS_QUESTION.format(task_instruction=task_text.strip())
        )
        system = PRIMO_SYSTEM_PROMPT if kwargs.system_prompt is None else kwargs.system_prompt
        return system, primo_user_text(question)

    def build_views(
        self, task_text: str, views: list[tuple[str, np.ndarray]], kwargs: BackendKwargs, score_mode: ScoreMode
    ) -> EngineRequest:
        # the official layout with the video replaced by one named clip per camera: the first
        # view's first frame, every view's clip after its name, the first view's last frame, the
        # official question (PRIMO-R1 was trained on one video: several are outside its training)
        system, text = self._question(task_text, kwargs)
        main = views[0][1]
        chat = ChatPrompt(system=system, user=(ImagePart(0), *view_parts(views), ImagePart(1), TextPart(text)))
        return clip_request(
            [frames for _, frames in views],
            chat=chat,
            images=[main[0], main[-1]],
            sampling=self.sampling(kwargs, score_mode),
            fps=self.fps,
        )

    def build_clips(
        self, task_text: str, clips: list[np.ndarray], kwargs: BackendKwargs, score_mode: ScoreMode
    ) -> EngineRequest:
        system, text = self._question(task_text, kwargs)
        # A curve's prefix: first frame, its clips in order, then its own last frame and the
        # question; everything up to the last frame is shared with the longer prefixes.
        chat = ChatPrompt(
            system=system,
            user=(ImagePart(0), *(VideoPart() for _ in clips), ImagePart(1), TextPart(text)),
        )
        return clip_request(
            clips,
            chat=chat,
            images=[clips[0][0], clips[-1][-1]],
            sampling=self.sampling(kwargs, score_mode),
            fps=self.fps,
        )
