"""The server's own machinery on the fake engine, in process: concurrency, admission, deadlines,
abort on disconnect, drain, error mapping, the raw batch path. Real HTTP (uvicorn), real app,
real decode workers; only the model is scripted (reward_server/engines/fake_engine.py). The
same behaviours are checked against vLLM and transformers in the engine tier."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time

import httpx
import numpy as np
import pytest

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol import raw_batch
from reward_protocol.score import BackendKwargs, ScoreOptions
from reward_server.media.video import fit_frames
from tests.helpers.episodes import TASK, episode_frames, inline
from tests.helpers.episodes import score_body as body
from tests.helpers.servers import InProcessServer, get, post, wait_until


def raw(episodes: list[tuple[ScoreOptions, np.ndarray | str]]) -> tuple[bytes, dict]:
    return raw_batch.encode(episodes).tobytes(), {"content-type": raw_batch.CONTENT_TYPE}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with InProcessServer(video_roots=[str(tmp_path_factory.mktemp("videos"))]) as s:
        yield s


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """Generation at 20 ms a token; few episodes admitted at once; short deadlines."""
    with InProcessServer(engine_option=["token_ms=20"], max_queue=3, request_timeout_s=2.0, max_tokens_limit=4096) as s:
        yield s


def test_raw_batch_frames_reach_the_engine_exactly(server):
    a = episode_frames(30, size=64, seed=1)
    b = episode_frames(5, size=100, seed=2)
    before = len(server.engine.seen)
    content, headers = raw([(ScoreOptions(task_text="task a", nframes=6), a), (ScoreOptions(task_text="task b"), b)])
    r = post(f"{server.url}/score/batch", content=content, headers=headers)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["response"]["nframes"] for x in results] == [6, 6]  # 5 frames: padded to an even count
    seen = {
        " ".join(p.text for p in req.chat.user if hasattr(p, "text")): req.video for req in server.engine.seen[before:]
    }
    got_a = next(v for t, v in seen.items() if "task a" in t)
    got_b = next(v for t, v in seen.items() if "task b" in t)
    spec = server.service.profile.frame_spec
    np.testing.assert_array_equal(got_a, fit_frames(a[spec.pick_steps(30, 6)], 200704))
    np.testing.assert_array_equal(got_b, fit_frames(b[[0, 1, 2, 3, 4, 4]], 200704))


def test_json_and_raw_batches_score_alike(server):
    frames = [episode_frames(12, seed=s) for s in range(3)]
    json_body = {"requests": [{"task_text": TASK, "frames": inline(f)} for f in frames]}
    by_json = post(f"{server.url}/score/batch", json=json_body).json()["results"]
    content, headers = raw([(ScoreOptions(task_text=TASK), f) for f in frames])
    by_raw = post(f"{server.url}/score/batch", content=content, headers=headers).json()["results"]
    assert [x["response"]["score"] for x in by_json] == [x["response"]["score"] for x in by_raw]


def test_client_score_episodes_uses_the_raw_path(server):
    episodes = [
        (ScoreOptions(task_text=TASK, nframes=4), np.full((9, 56, 56, 3), 255 * i // 4, np.uint8)) for i in range(5)
    ]
    with RewardClient(server.url) as client:
        items = client.score_episodes(episodes)
    assert [i.index for i in items] == list(range(5))
    assert [round(i.response.score, 2) for i in items] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_one_bad_item_does_not_fail_the_batch(server, tmp_path):
    content, headers = raw(
        [
            (ScoreOptions(task_text=TASK), episode_frames(6)),
            (ScoreOptions(task_text=TASK), "/etc/passwd"),
            (ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(score_mode="logprob")), episode_frames(6)),
        ]
    )
    results = post(f"{server.url}/score/batch", content=content, headers=headers).json()["results"]
    assert results[0]["response"]["parse_status"] == "ok"
    assert results[1]["error"]["type"] == "path_not_allowed" and "/etc/passwd" in results[1]["error"]["message"]
    assert results[2]["response"]["parse_status"] == "logprob"


def test_one_schema_invalid_item_of_a_json_batch_is_that_items_error_and_the_others_are_scored(server):
    """Issue 58 class 10: before, one item the schema refuses (nframes 0, a 5000-character task,
    an unknown field) was a 422 for the whole batch, and its good items were never scored."""
    good = body(episode_frames(6))
    bad = [{**good, "nframes": 0}, {**good, "task_text": "x" * 5000}, {**good, "colour": "red"}]
    r = post(f"{server.url}/score/batch", json={"requests": [good, *bad, good]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [item["index"] for item in results] == [0, 1, 2, 3, 4]
    assert results[0]["response"]["parse_status"] == "ok" and results[4]["response"]["parse_status"] == "ok"
    for index, field in ((1, "nframes"), (2, "task_text"), (3, "colour")):
        error = results[index]["error"]
        assert error["type"] == "invalid_request" and not error["retryable"], error
        assert error["message"].startswith(f"requests.{index}.{field}: "), error
    # what is not a batch still fails as a whole
    for envelope in ({"requests": []}, {"requests": good}, {"requests": [good], "extra": 1}):
        r = post(f"{server.url}/score/batch", json=envelope)
        assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request", r.text


@pytest.mark.parametrize(
    "content, status, kind, fragment",
    [
        (b"", 422, "invalid_request", "shorter"),  # Content-Length: 0 (once hung: a cancel lost in wait_for)
        (b"RWB1", 422, "invalid_request", "shorter"),
        (b"XXXX\x02\x00\x00\x00{}", 422, "invalid_request", "not a raw batch"),
        (b"RWB1\xff\xff\xff\x7f", 422, "invalid_request", "limit"),
        (b"RWB1\x05\x00\x00\x00{bad}", 422, "invalid_request", "not valid JSON"),
        (b'RWB1\x0f\x00\x00\x00{"requests":[]}', 422, "invalid_request", "requests"),
    ],
)
def test_malformed_raw_bodies_are_refused_with_the_reason(server, content, status, kind, fragment):
    r = post(f"{server.url}/score/batch", content=content, headers={"content-type": raw_batch.CONTENT_TYPE})
    assert r.status_code == status and r.json()["error"]["type"] == kind, r.text
    assert fragment in r.json()["error"]["message"]


def test_raw_frames_beyond_the_payload_are_refused(server):
    content, headers = raw([(ScoreOptions(task_text=TASK), episode_frames(4))])
    r = post(f"{server.url}/score/batch", content=content[:-10], headers=headers)
    assert r.status_code == 422 and "payload bytes" in r.json()["error"]["message"]


def test_raw_body_needs_a_length(server):
    content, headers = raw([(ScoreOptions(task_text=TASK), episode_frames(4))])
    r = post(f"{server.url}/score/batch", content=iter([content]), headers=headers)  # chunked, no length
    assert r.status_code == 411 and r.json()["error"]["type"] == "length_required"


def test_concurrent_requests_all_answered_and_counted(server):
    with cf.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: post(f"{server.url}/score", json=body(), timeout=30), range(32)))
    assert {a.status_code for a in answers} == {200}
    assert server.service.admission.episodes == 0 and server.service.admission.bytes == 0
    metrics = get(f"{server.url}/metrics").text
    assert 'reward_requests_total{code="200",route="/score"}' in metrics


def test_admission_refuses_beyond_max_queue_then_recovers(slow):
    heavy = body(backend_kwargs={"max_tokens": 40})  # 0.8 s each
    with cf.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(f"{slow.url}/score", json=heavy, timeout=30), range(8)))
    codes = [a.status_code for a in answers]
    assert codes.count(200) >= 3 and 503 in codes, codes
    refused = next(a for a in answers if a.status_code == 503)
    assert refused.headers["retry-after"] == "1" and refused.json()["error"]["type"] == "overloaded"
    assert wait_until(lambda: slow.service.admission.episodes == 0)
    # the client's retries ride it out: every episode scored
    with (
        RewardClient(slow.url, RetryPolicy(deadline_s=60, backoff_max_s=0.5)) as client,
        cf.ThreadPoolExecutor(8) as pool,
    ):
        from reward_protocol.score import ScoreRequest

        done = list(pool.map(lambda _: client.score(ScoreRequest.model_validate(heavy)), range(8)))
    assert len(done) == 8


def test_deadline_aborts_the_engine_work_and_frees_the_slot(slow):
    engine = slow.engine
    aborted = engine.stats.aborted
    started = time.monotonic()
    r = post(f"{slow.url}/score", json=body(backend_kwargs={"max_tokens": 4000}), timeout=30)  # 80 s of tokens
    assert r.status_code == 504 and r.json()["error"]["type"] == "deadline_exceeded"
    assert time.monotonic() - started < 20  # the 2 s deadline, not the 80 s of tokens
    assert engine.stats.aborted == aborted + 1 and engine.stats.running == 0
    tokens = engine.tokens_generated
    time.sleep(0.3)
    assert engine.tokens_generated == tokens  # nothing generates for a request no one waits for
    assert slow.service.admission.episodes == 0


def test_client_disconnect_aborts_the_engine_work(slow):
    engine = slow.engine
    aborted = engine.stats.aborted
    payload = json.dumps(body(backend_kwargs={"max_tokens": 4000})).encode()  # 80 s of tokens
    sock = socket.create_connection(("127.0.0.1", slow.settings.port))
    sock.sendall(
        b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    assert wait_until(lambda: engine.stats.running == 1, 30)  # generating for this client
    sock.close()  # the client goes away
    assert wait_until(lambda: engine.stats.aborted == aborted + 1 and engine.stats.running == 0, 10)
    tokens = engine.tokens_generated
    time.sleep(0.3)
    assert engine.tokens_generated == tokens
    assert wait_until(lambda: slow.service.admission.episodes == 0 and slow.service.admission.bytes == 0)


def test_batch_past_its_deadline_answers_finished_items_and_marks_the_rest(slow):
    content, headers = raw(
        [
            (ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(max_tokens=5)), episode_frames(4)),
            (ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(max_tokens=4000)), episode_frames(4)),
        ]
    )
    r = post(f"{slow.url}/score/batch", content=content, headers=headers, timeout=30)
    results = r.json()["results"]
    assert results[0]["response"]["output_tokens"] == 5
    assert results[1]["error"]["type"] == "deadline_exceeded"


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/metrics", "/stats", "/openapi.json"])
def test_head_is_answered_on_get_routes(server, path):
    """Monitors probe with HEAD: the GET answer's status and headers, no body (before: 405)."""
    got, head = get(f"{server.url}{path}"), httpx.head(f"{server.url}{path}", timeout=30)
    assert head.status_code == got.status_code == 200, head.text
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
    assert httpx.head(f"{server.url}/score", timeout=30).status_code == 405


def test_max_tokens_beyond_the_server_limit_is_refused(server):
    r = post(f"{server.url}/score", json=body(backend_kwargs={"max_tokens": 8000}))
    assert r.status_code == 400 and "--max-tokens-limit" in r.json()["error"]["message"]


def test_bytes_in_flight_are_bounded_before_the_body_is_read():
    with InProcessServer(max_inflight_mb=1, max_body_mb=1) as s:
        r = post(f"{s.url}/score", content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large"
    with InProcessServer(max_inflight_mb=1, max_body_mb=1, engine_option=["delay_ms=1500"]) as s:
        frames = episode_frames(8, size=128)  # ~0.5 MB of JSON each: two do not fit in 1 MB at once
        with cf.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: post(f"{s.url}/score", json=body(frames), timeout=30), range(3)))
        codes = sorted(a.status_code for a in answers)
        assert 200 in codes and 503 in codes, codes
        assert any("--max-inflight-mb" in a.json()["error"]["message"] for a in answers if a.status_code == 503)


def test_engine_error_is_a_500_without_internals_and_death_is_reported():
    with InProcessServer(engine_option=["fail_on=FAILNOW", "refuse_on=REFUSENOW", "die_on=DIENOW"]) as s:
        r = post(f"{s.url}/score", json={**body(), "task_text": "FAILNOW please"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
        assert "fake" not in r.text and "Traceback" not in r.text
        assert get(f"{s.url}/health").json()["status"] == "ok"
        # one request the engine failed as retryable: 503 the client retries, never a score
        r = post(f"{s.url}/score", json={**body(), "task_text": "REFUSENOW please"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "engine_request_failed"
        assert r.headers["retry-after"] == "1"
        assert get(f"{s.url}/health").json()["status"] == "ok"
        assert post(f"{s.url}/score", json=body()).status_code == 200
        r = post(f"{s.url}/score", json={**body(), "task_text": "DIENOW please"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "engine_failed"
        health = get(f"{s.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert post(f"{s.url}/score", json=body()).status_code == 503


def test_drain_finishes_work_in_hand_and_refuses_new():
    with InProcessServer(engine_option=["token_ms=10"], shutdown_timeout_s=30) as s:
        with cf.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                httpx.post, f"{s.url}/score", json=body(backend_kwargs={"max_tokens": 100}), timeout=30
            )
            assert wait_until(lambda: s.engine.stats.running == 1, 30)
            s.server.request_exit()
            assert wait_until(lambda: s.service.status == "draining", 30)
            refused = post(f"{s.url}/score", json=body(), timeout=5)
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "not_ready"
            health = get(f"{s.url}/health", timeout=5)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            assert pending.result().status_code == 200 and pending.result().json()["output_tokens"] == 100
        s.thread.join(60)
        assert not s.thread.is_alive()


def test_split_answer_words_refuse_logprob_with_the_cause():
    with InProcessServer(engine_option=["split_words=Yes"]) as s:
        health = get(f"{s.url}/health").json()
        assert health["status"] == "ok" and "logprob" not in health["score_modes"]
        r = post(f"{s.url}/score", json=body(backend_kwargs={"score_mode": "logprob"}))
        assert r.status_code == 400 and r.json()["error"]["type"] == "unsupported_option"
        assert "'Yes' is 2 tokens" in r.json()["error"]["message"]
        assert post(f"{s.url}/score", json=body()).status_code == 200  # other modes still serve
    with InProcessServer(engine_option=["split_words=Yes"], score_mode="logprob") as s:
        health = get(f"{s.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "'Yes' is 2 tokens" in health.json()["detail"]


def test_bearer_scheme_is_case_insensitive():
    with InProcessServer(api_key="s3cret") as s:
        assert post(f"{s.url}/score", json=body()).status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = post(f"{s.url}/score", json=body(), headers={"Authorization": f"{scheme} s3cret"})
            assert r.status_code == 200, scheme
        assert post(f"{s.url}/score", json=body(), headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert get(f"{s.url}/health").status_code == 200


def test_profiling_routes_say_how_to_turn_the_profiler_on(server):
    """/start_profile and /stop_profile trace vLLM's engine (engines/vllm/profiler.py); another
    engine, or vLLM without --engine-option profile_dir, is answered 400 with what to do."""
    for route in ("/start_profile", "/stop_profile"):
        r = post(f"{server.url}{route}")
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "--engine-option profile_dir=DIR" in message and "fake" in message
    server.service.status = "loading"  # before the engine serves: not ready, whatever the engine
    try:
        r = post(f"{server.url}/start_profile")
        assert r.status_code == 503 and r.json()["error"]["type"] == "not_ready", r.text
    finally:
        server.service.status = "ok"
