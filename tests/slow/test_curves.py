"""Progress curves under generated requests (frames, nframes, K, mode, route): a 200 with a well-
formed curve or a 422, never a 5xx."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_protocol import raw_batch
from reward_protocol.score import BackendKwargs, ScoreOptions
from tests.helpers.episodes import TASK, inline, ramp
from tests.helpers.servers import InProcessServer, get, post


@pytest.fixture(scope="module")
def server():
    with InProcessServer(max_progress_points=16) as s:
        yield s


def test_curve_requests_never_fail_the_server(server):
    """Generated curve requests (frames, nframes, K, mode, route): a 200 with a well-formed
    curve or a 422, never a 5xx; the server stays healthy. Bounded: 60 cases."""

    @given(
        steps=st.integers(1, 20),
        nframes=st.integers(1, 24),
        points=st.integers(-2, 40),
        mode=st.sampled_from(["auto", "logprob"]),
        raw=st.booleans(),
    )
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(steps, nframes, points, mode, raw):
        frames = ramp(steps, size=28)
        item = {
            "task_text": TASK,
            "nframes": nframes,
            "progress_points": points,
            "backend_kwargs": {"score_mode": mode},
        }
        if raw:
            options = ScoreOptions.model_construct(
                task_text=TASK,
                nframes=nframes,
                progress_points=points,
                backend_kwargs=BackendKwargs(score_mode=mode),
                max_pixels=200704,
                backend=None,
                request_id=None,
            )
            content = raw_batch.encode([(options, frames)])
            r = post(
                f"{server.url}/score/batch", content=content.tobytes(), headers={"content-type": raw_batch.CONTENT_TYPE}
            )
        else:
            r = post(f"{server.url}/score", json={**item, "frames": inline(frames)})
        assert r.status_code in (200, 422), r.text
        if r.status_code != 200:
            return
        answer = r.json()["results"][0] if raw else r.json()
        if raw and answer["error"] is not None:
            assert answer["error"]["type"] == "invalid_request", answer
            return
        answer = answer["response"] if raw else answer
        if points == 1:
            assert answer["progress"] is None
            return
        assert len(answer["progress"]) == points <= answer["nframes"]
        assert all(0.0 <= v <= 1.0 for v in answer["progress"])
        assert answer["score"] == answer["progress"][-1]

    run()
    assert get(f"{server.url}/health").status_code == 200
