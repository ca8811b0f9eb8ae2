"""A scripted engine for testing the server's own machinery in milliseconds.

No model: it answers from the frames it is given, after a scripted delay, so admission,
deadlines, drain, abort, error mapping and batch handling can be tested in process. Registered
like a real engine (`--engine fake`); the real-engine tests (vLLM, transformers) stay beside it.

Options (`EngineConfig.options`, or `--engine-option key=value` on the command line):
- `delay_ms` (default 0): time per request; `token_ms` (default 0): time per generated token,
  so a request for `max_tokens` takes `delay_ms + max_tokens * token_ms`.
- `answer` (default "{score}"): the text answered; `{score}` is the mean brightness of the last
  frame (or, with no video, the last image) on a 0-100 scale, so brighter final frames score
  higher (tests can steer the score). Prompt tokens: 10 per frame or image plus the words.
- `answer_words` (default ""): comma-separated words; when set, the text answered is one of them
  picked by that brightness (the darkest third of the scale the first word, and so on), so a test
  can steer a worker that reads words (RLinf's trend parser: "negative,unclear,positive").
- `fail_on` (default ""): a task-text fragment that makes the engine raise (an engine error);
  `refuse_on`: one that fails just that request as retryable (EngineRequestFailed, as vLLM's
  request-level errors end); `refuse_once_on`: the same, but only the first time a given prompt
  holding it arrives (a fault that resending fixes); `die_on`: one that kills the engine
  (EngineDead).
- `abort_on`, `unfinished_on`, `empty_on` (default ""): task-text fragments that make the engine
  end the request itself without an answer, as a real engine can: `finish_reason` "abort" (vLLM's
  engine core stopping on a signal), no finish reason (an output that ended unfinished), or no
  token and no log-probabilities. `nan_logprob_on`: the logprob mode's log-probabilities are NaN.
- `split_words` (default ""): comma-separated answer words the fake tokenizer splits in two.
- `seen_media` (default 64): `seen` lists every request, but only the most recent ones keep their
  frames and images; older entries are copies without them, so a long run on this engine (a
  chaos test, a soak, a memory measurement) does not keep every episode's pixels.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

from reward_server.engines.base import Engine, EngineConfig, EngineDead, EngineRequestFailed
from reward_server.engines.io import EngineOutput, EngineRequest, TokenLogprob


class FakeEngineError(RuntimeError):
    pass


class FakeEngine(Engine):
    name = "fake"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        o = config.options
        self.delay_s = float(o.get("delay_ms", 0)) / 1000
        self.token_s = float(o.get("token_ms", 0)) / 1000
        self.answer = str(o.get("answer", "{score}"))
        self.fail_on = str(o.get("fail_on", ""))
        self.refuse_on = str(o.get("refuse_on", ""))
        self.refuse_once_on = str(o.get("refuse_once_on", ""))
        self.refused_once: set[str] = set()  # prompts already failed by refuse_once_on
        self.die_on = str(o.get("die_on", ""))
        self.abort_on = str(o.get("abort_on", ""))
        self.unfinished_on = str(o.get("unfinished_on", ""))
        self.empty_on = str(o.get("empty_on", ""))
        self.nan_logprob_on = str(o.get("nan_logprob_on", ""))
        self.split_words = {w for w in str(o.get("split_words", "")).split(",") if w}
        self.answer_words = [w for w in str(o.get("answer_words", "")).split(",") if w]
        self.started = False
        self.dead: str | None = None
        self.seen: list[EngineRequest] = []  # every request, in arrival order (tests read it)
        self.seen_media = int(o.get("seen_media", 64))
        self.tokens_generated = 0  # tokens "produced" so far, across requests; stops on abort

    @property
    def model_name(self) -> str:
        return f"fake:{self.config.model_path}"

    async def start(self) -> None:
        await asyncio.sleep(float(self.config.options.get("start_ms", 0)) / 1000)
        self.started = True

    def answer_token_ids(self, word: str) -> list[int]:
        return [1, 2] if word in self.split_words else [abs(hash(word)) % 1000]

    async def _generate(self, request: EngineRequest) -> EngineOutput:
        if self.dead:
            raise EngineDead(self.dead)
        self.seen.append(request)
        old = len(self.seen) - 1 - self.seen_media
        if old >= 0 and self.seen[old].videos() + self.seen[old].images:
            # a copy without pixels: a request still in flight keeps its own frames
            self.seen[old] = dataclasses.replace(self.seen[old], video=None, images=[], clips=[])
        text = " ".join(request.chat.texts())
        started = time.perf_counter()
        await asyncio.sleep(self.delay_s)
        if self.die_on and self.die_on in text:
            self.dead = "the fake engine was told to die"
            raise EngineDead(self.dead)
        if self.fail_on and self.fail_on in text:
            raise FakeEngineError("the fake engine was told to fail")
        if self.refuse_on and self.refuse_on in text:
            raise EngineRequestFailed("the fake engine failed this request; send it again")
        if self.refuse_once_on and self.refuse_once_on in text and text not in self.refused_once:
            self.refused_once.add(text)
            raise EngineRequestFailed("the fake engine failed this request once; send it again")
        s = request.sampling
        tokens = 0
        if s.mode == "generate" and self.token_s > 0:
            # unset max_tokens (the context left, in a real engine): the cap, here at most 64 tokens
            count = s.max_tokens if s.max_tokens is not None else min(s.max_tokens_cap or 64, 64)
            for _ in range(count):  # cancellation lands between tokens, as in a real engine
                await asyncio.sleep(self.token_s)
                tokens += 1
                self.tokens_generated += 1
                if tokens == 1:
                    self.first_token(request.request_id)
        # the last picture the model sees: the video's last frame, else the last image
        videos = request.videos()
        last = videos[-1][-1] if videos else (request.images[-1] if request.images else None)
        brightness = float(last.mean()) / 255 if last is not None and last.size else 0.0
        frames = sum(v.shape[0] for v in videos) + len(request.images)
        out = EngineOutput(
            prompt=text,
            prompt_tokens=int(frames * 10 + len(text.split())),
            output_tokens=tokens or 1,
            finish_reason="length" if tokens else "stop",
            engine_ms=(time.perf_counter() - started) * 1000,
        )
        if s.mode == "logprob":
            p = min(max(brightness, 1e-6), 1 - 1e-6)
            out.logprob_positive, out.logprob_negative = math.log(p), math.log(1 - p)
            out.output_tokens = 0
            if self.nan_logprob_on and self.nan_logprob_on in text:
                out.logprob_positive = math.nan
        else:
            if self.answer_words:
                out.text = self.answer_words[min(int(brightness * len(self.answer_words)), len(self.answer_words) - 1)]
            else:
                out.text = self.answer.format(score=round(brightness * 100))
            if s.logprobs is not None:
                out.token_logprobs = [
                    TokenLogprob(out.text, -0.5, tuple((f"alt{i}", -1.0 - i) for i in range(s.logprobs)))
                ]
        return self._ended_early(text, out)

    def _ended_early(self, text: str, out: EngineOutput) -> EngineOutput:
        """The output as the engine would end it on its own (abort_on, unfinished_on, empty_on):
        an abort before the first token (vLLM's shape: no text, no log-probabilities), an answer
        cut off half way, or nothing at all."""
        if self.abort_on and self.abort_on in text:
            out.finish_reason, out.text, out.output_tokens = "abort", "", 0
            out.logprob_positive = out.logprob_negative = None
        elif self.unfinished_on and self.unfinished_on in text:
            out.finish_reason, out.text = None, out.text[: len(out.text) // 2]
        elif self.empty_on and self.empty_on in text:
            out.text, out.output_tokens, out.logprob_positive, out.logprob_negative = "", 0, None, None
        return out

    def vocab_size(self) -> int | None:
        return 1000

    async def check_health(self) -> None:
        if not self.started:
            raise EngineDead("the fake engine is not started")
        if self.dead:
            raise EngineDead(self.dead)
