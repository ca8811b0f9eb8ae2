"""Uploads that stall never hold the door (issue 30): admission and memory follow the bytes that
arrived, a body has a total deadline a trickle cannot extend, and other clients are served while
uploads stall, with a declared Content-Length or a chunked body. Fast tier, fake engine."""

from __future__ import annotations

import asyncio
import time

import pytest

from reward_server.core.admission import Admission, BodyOverloaded
from reward_server.http.body import BodyLimits, BodyReader
from reward_tools.stalled_upload import StalledUpload
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import InProcessServer, post, stats

TASK = "put the bowl on the plate"


def small_score(url: str) -> int:
    return post(f"{url}/score", json={"task_text": TASK, "frames": inline(episode_frames(4))}, timeout=10).status_code


@pytest.mark.parametrize("declared", [512 * 2**20, None], ids=["content-length", "chunked"])
def test_a_trickling_upload_is_cut_with_408_by_the_total_deadline(declared):
    """One byte every 0.2 s never leaves the connection idle for --body-timeout-s (1 s): only the
    minimum rate after the grace cuts it, while the client is still sending."""
    with InProcessServer(body_timeout_s=1, body_min_rate_kib_s=1) as s:
        upload = StalledUpload(s.settings.port, declared)
        for _ in range(150):  # 30 s of trickle at most: far past the deadline (~1 s)
            if not upload.tick():
                break
            time.sleep(0.2)
        assert upload.closed, "the trickle was never cut"
        assert upload.status == 408 and upload.error_type == "body_timeout", (upload.status, upload.message)
        assert "--body-min-rate-kib-s" in upload.message, upload.message
        assert upload.sent < 150
        assert stats(s.url)["bytes_in_progress"] == 0
        assert small_score(s.url) == 200


def test_other_clients_are_served_while_uploads_stall_and_declared_bytes_take_no_budget():
    """16 uploads declare 48 MiB each (768 MiB) or send chunked bodies, against a 64 MiB in-flight
    budget, then stall: they hold only the bytes they sent, and small requests are all served."""
    with InProcessServer(max_inflight_mb=64, max_body_mb=60) as s:
        uploads = [StalledUpload(s.settings.port, 48 * 2**20) for _ in range(8)]
        uploads += [StalledUpload(s.settings.port, None) for _ in range(8)]
        for up in uploads:
            assert up.tick()
        time.sleep(0.5)  # let the server take in the bytes sent
        assert stats(s.url)["bytes_in_progress"] == sum(up.sent for up in uploads)
        codes = [small_score(s.url) for _ in range(10)]
        assert codes == [200] * 10, codes
        assert all(up.tick() for up in uploads), "a stalled upload was refused while still within its deadline"
        for up in uploads:
            up.close()


def test_a_body_that_would_overflow_the_budget_as_it_arrives_gets_a_retryable_503():
    """Declared bytes take nothing, so the limit is met by arrived bytes: the body that crosses
    it is refused then (503 + Retry-After, connection closed) and gives its bytes back."""
    with InProcessServer(max_inflight_mb=1, max_body_mb=1) as s:
        first = StalledUpload(s.settings.port, 1024 * 1024)
        first._sock.sendall(b" " * (700 * 1024))  # held: 700 KiB of the 1 MiB budget
        time.sleep(0.5)
        second = StalledUpload(s.settings.port, 1024 * 1024)
        second._sock.sendall(b" " * (700 * 1024))
        assert second.answer(10) == 503 and second.error_type == "overloaded", (second.status, second.message)
        assert "--max-inflight-mb" in second.message
        assert stats(s.url)["bytes_in_progress"] == first.sent + 700 * 1024
        first.close()
        assert small_score(s.url) == 200


def test_concurrent_bodies_over_the_budget_are_refused_one_at_a_time_and_one_is_served():
    """Four bodies of 40 bytes arrive in lockstep against a budget of 100: each refused body gives
    its bytes back the moment it is refused (not when its handler closes it), so the others go on
    and at least one arrives whole. Refused together, a burst would be refused whole, every time."""

    async def scenario() -> tuple[list[BodyReader], Admission]:
        admission = Admission(max_work=8, max_bytes=100)
        limits = BodyLimits(max_bytes=40, idle_timeout_s=5, min_rate=1, total_s=30)
        queues = [asyncio.Queue() for _ in range(4)]
        readers = [BodyReader(q.get, 40, limits, admission).start() for q in queues]
        for sent in range(0, 40, 5):
            for q in queues:
                q.put_nowait({"type": "http.request", "body": b"x" * 5, "more_body": sent + 5 < 40})
            await asyncio.sleep(0)  # every reader takes its chunk before the next round: a burst
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        return readers, admission

    readers, admission = asyncio.run(scenario())
    done = [r for r in readers if r.done]
    refused = [r for r in readers if isinstance(r.error, BodyOverloaded)]
    assert len(done) >= 1 and len(done) + len(refused) == 4, [(r.received, r.error) for r in readers]
    assert all(r.held == 0 for r in refused)
    assert admission.bytes == sum(r.held for r in done) == 40 * len(done)


def test_a_client_deadline_that_passes_while_the_body_arrives_is_a_retryable_504_not_a_refusal():
    """Issue 58 class 9. Before, a body cut by the client's own X-Reward-Deadline-S was the 408
    body_timeout of a refused upload, non-retryable, blaming --request-timeout-s."""
    with InProcessServer(body_timeout_s=30, body_min_rate_kib_s=0.001) as s:
        # a deadline too short for any body: the whole body is sent, the deadline has passed
        body = {"task_text": TASK, "frames": inline(episode_frames(4))}
        r = post(f"{s.url}/score", json=body, headers={"X-Reward-Deadline-S": "1e-300"})
        error = r.json()["error"]
        assert r.status_code == 504 and error["type"] == "deadline_exceeded" and error["retryable"], r.text
        assert "X-Reward-Deadline-S" in error["message"] and "body was arriving" in error["message"], error
        assert "--request-timeout-s" not in error["message"], error
        # a body still arriving when the client's 0.5 s pass: cut then, the connection closed
        t0 = time.monotonic()
        upload = StalledUpload(s.settings.port, 2**20, headers={"X-Reward-Deadline-S": "0.5"})
        upload.answer(10)
        assert (upload.status, upload.error_type, upload.retryable) == (504, "deadline_exceeded", True), upload
        assert "0.5 s (X-Reward-Deadline-S)" in upload.message, upload.message
        assert time.monotonic() - t0 < 3
        assert stats(s.url)["bytes_in_progress"] == 0
        assert small_score(s.url) == 200


@pytest.mark.parametrize("header", [None, "30"], ids=["no client deadline", "a longer client deadline"])
def test_a_slow_upload_past_the_servers_own_limit_stays_a_408(header):
    """The server's --request-timeout-s (1 s) is what cuts the body: a refusal, 408 body_timeout."""
    with InProcessServer(request_timeout_s=1, body_timeout_s=30, body_min_rate_kib_s=0.001) as s:
        upload = StalledUpload(s.settings.port, 2**20, headers={"X-Reward-Deadline-S": header} if header else {})
        upload.answer(10)
        assert (upload.status, upload.error_type, upload.retryable) == (408, "body_timeout", False), upload
        assert "--request-timeout-s" in upload.message, upload.message
