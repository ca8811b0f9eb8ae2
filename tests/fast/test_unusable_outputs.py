"""Outputs that are not the model's answer never reach a parser (issue 42, items 1 and 3), on the
fast tier: the fake engine ends requests the way a real engine can (`abort_on`: finish_reason
"abort" from the engine itself; `unfinished_on`; `empty_on`) and gives NaN log-probabilities
(`nan_logprob_on`). The real engines are tested the same way in test_engine_faults.py.

- An engine's own abort, an unfinished or an empty output: a retryable item error in a batch, a
  retryable 503 for a single /score, a 503 on the chat route; counted in /stats and /metrics,
  never `parse_status` anything. The server's own aborts (client gone) stay counted apart.
- A NaN or infinite log-probability: `score: null`, `parse_status: invalid_logprob` with a
  `parse_error`, counted in `reward_parse_failures` (before: `parse_status: logprob`, no error,
  not counted).
"""

from __future__ import annotations

import math

import pytest

from reward_server.engines.base import unusable_output
from reward_server.engines.io import EngineOutput, EngineRequest, Sampling
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import InProcessServer, get, post, send_without_waiting

FAULTS = ["abort_on=ENGINEABORT", "unfinished_on=CUTOFF", "empty_on=NOTHING", "nan_logprob_on=NANPROB"]


def body(task: str, **options) -> dict:
    return {"task_text": task, "frames": inline(episode_frames(8, size=56)), **options}


@pytest.fixture(scope="module")
def server():
    with InProcessServer(engine_option=FAULTS) as s:
        yield s


@pytest.mark.parametrize("mode", ["logprob", "percentage"])
@pytest.mark.parametrize("word, reason", [("ENGINEABORT", "abort"), ("CUTOFF", "unfinished"), ("NOTHING", "empty")])
def test_an_output_the_engine_ended_is_a_retryable_error_never_a_score(server, word, reason, mode):
    kwargs = {"backend_kwargs": {"score_mode": mode}}
    before = get(f"{server.url}/stats").json()["unusable_outputs"].get(reason, 0)
    batch = post(
        f"{server.url}/score/batch",
        json={"requests": [body("put the bowl away", **kwargs), body(f"put the {word} away", **kwargs)]},
    )
    assert batch.status_code == 200, batch.text
    good, bad = batch.json()["results"]
    assert good["response"]["score"] is not None and good["error"] is None
    assert bad["response"] is None, bad  # never parsed: no parse_status, no fallback score
    assert bad["error"]["type"] == "engine_request_failed" and bad["error"]["retryable"], bad
    single = post(f"{server.url}/score", json=body(f"put the {word} away", **kwargs))
    assert single.status_code == 503 and single.headers.get("Retry-After"), single.text
    assert single.json()["error"]["type"] == "engine_request_failed"
    stats = get(f"{server.url}/stats").json()
    assert stats["unusable_outputs"][reason] == before + 2
    metrics = get(f"{server.url}/metrics").text
    assert f'reward_engine_unusable_outputs{{reason="{reason}"}} {float(before + 2)}' in metrics


def test_chat_route_refuses_an_aborted_output_too(server):
    request = {
        "model": server.service.settings.effective_served_model_name(),
        "messages": [{"role": "user", "content": "tell the ENGINEABORT story"}],
        "max_tokens": 4,
    }
    r = post(f"{server.url}/v1/chat/completions", json=request)
    assert r.status_code == 503, r.text
    assert post(f"{server.url}/v1/chat/completions", json={**request, "messages": [
        {"role": "user", "content": "tell a story"}]}).status_code == 200  # fmt: skip


def test_server_aborts_are_not_engine_aborts(server):
    """A client that leaves is the server's abort: counted in `aborted`, not as an unusable output."""
    import time

    slow = InProcessServer(engine_option=[*FAULTS, "delay_ms=3000"])
    with slow:
        sock = send_without_waiting(slow.url, "/score", body("put the bowl away"))
        deadline = time.monotonic() + 30
        while get(f"{slow.url}/stats").json()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        sock.close()
        while get(f"{slow.url}/stats").json()["aborted"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = get(f"{slow.url}/stats").json()
    assert stats["aborted"] == 1 and stats["unusable_outputs"] == {}, stats


def test_nan_logprob_is_a_counted_parse_failure_with_its_reason(server):
    def failures() -> float:
        for line in get(f"{server.url}/metrics").text.splitlines():
            if line.startswith('reward_parse_failures_total{status="invalid_logprob"}'):
                return float(line.split()[-1])
        return 0.0

    before = failures()
    r = post(f"{server.url}/score", json=body("put the NANPROB away", backend_kwargs={"score_mode": "logprob"}))
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["score"] is None and data["parse_status"] == "invalid_logprob", data
    assert "nan" in data["parse_error"], data
    assert failures() == before + 1


@pytest.mark.parametrize(
    "mode, finish, tokens, text, pair, reason",
    [
        ("logprob", "abort", 0, "", (None, None), "abort"),
        ("generate", None, 3, "4", (None, None), "unfinished"),
        ("generate", "error", 0, "", (None, None), "unfinished"),
        ("generate", "stop", 0, "", (None, None), "empty"),
        ("logprob", "length", 0, "", (None, -1.0), "empty"),
        ("generate", "length", 8, "the model rambled", (None, None), None),  # the model's answer: parsed
        ("generate", "stop", 1, "", (None, None), None),  # EOS at once: the model's (empty) answer
        ("logprob", "length", 0, "", (-0.1, -2.0), None),
        ("logprob", "length", 0, "", (-math.inf, -math.inf), None),  # a parse failure, not an engine fault
    ],
)
def test_unusable_output_rule(mode, finish, tokens, text, pair, reason):
    request = EngineRequest(chat=None, video=None, sampling=Sampling(mode=mode))  # type: ignore[arg-type]
    output = EngineOutput(text=text, output_tokens=tokens, finish_reason=finish)
    output.logprob_positive, output.logprob_negative = pair
    found = unusable_output(request, output)
    assert (found.reason if found else None) == reason
