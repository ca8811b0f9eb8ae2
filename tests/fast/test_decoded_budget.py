"""The decoded-memory budget (--max-decoded-mb, issue 30): every episode's decoded size is taken
from one budget before its frames are made, whatever carried them (raw batch, inline frames, a
video file, a chat request's images and video); an episode or chat request that can never fit is
a 413 naming the flag, one that must wait waits its turn, and the budget is visible in /stats and
/metrics. Fast tier, fake engine."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time

import numpy as np
import pytest

from reward_client.video_io import write_mp4
from reward_protocol import raw_batch
from reward_protocol.frames import QWEN2_5_VL
from reward_protocol.score import ScoreOptions
from reward_server.media.decoded_budget import DecodedBudget, DecodedTooLarge, decoded_bytes
from reward_server.media.images import ImageError, decode_image
from reward_server.media.memory_release import Reclaimer
from reward_server.media.video import DecodeLimits, Probe
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.memory import collector_off, frames_in_a_cycle, freed
from tests.helpers.servers import (
    CHAT,
    InProcessServer,
    chat_body,
    data_url,
    get,
    image_part,
    openai_error,
    png_bytes,
    post,
    send_without_waiting,
    stats,
    wait_until,
)

TASK = "put the bowl on the plate"
MB = 2**20


def test_waiters_are_served_first_come_first_served_and_a_cancelled_wait_takes_nothing():
    async def scenario() -> None:
        budget = DecodedBudget(10)
        first = await budget.take(6 * MB)
        big = asyncio.ensure_future(budget.take(8 * MB))  # waits for `first`
        small = asyncio.ensure_future(budget.take(3 * MB))  # fits now, but waits behind `big`
        gone = asyncio.ensure_future(budget.take(2 * MB))
        await asyncio.sleep(0)
        assert not big.done() and not small.done()
        gone.cancel()
        await asyncio.sleep(0)
        first.release()
        lease = await big
        await asyncio.sleep(0)
        assert budget.in_use == 8 * MB and not small.done()  # 8 + 3 > 10
        lease.release()
        (await small).release()
        assert budget.in_use == 0 and budget.peak == 8 * MB
        with pytest.raises(DecodedTooLarge, match="--max-decoded-mb"):
            await budget.take(11 * MB)

    asyncio.run(scenario())


def test_waits_cancelled_together_take_nothing_and_raise_only_their_cancellation():
    """A batch's deadline cancels all its waiting episodes at once: the first one's cleanup wakes
    the queue, which drops the second's (cancelled) wait before its own cleanup runs. Before, that
    cleanup raised ValueError (an internal_error per episode) instead of the deadline's 504."""

    async def scenario() -> None:
        budget = DecodedBudget(10)
        held = await budget.take(8 * MB)
        first = asyncio.ensure_future(budget.take(5 * MB))
        second = asyncio.ensure_future(budget.take(1 * MB))  # fits, but waits behind `first`
        await asyncio.sleep(0)
        first.cancel()
        second.cancel()
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        assert budget.in_use == 8 * MB and not budget._waiters
        held.release()
        assert budget.in_use == 0

    asyncio.run(scenario())


def test_frames_a_reference_cycle_keeps_are_freed_once_their_budget_is_given_back():
    """An exception's traceback keeps the locals of its frames (decoded pixels) in a cycle that
    only the collector frees; the reclaimer collects once enough decoded memory was given back."""

    async def scenario() -> None:
        budget = DecodedBudget(10, Reclaimer(threshold_bytes=MB, delay_s=0).released)
        lease = await budget.take(2 * MB)
        ref = frames_in_a_cycle(2 * MB)
        lease.release()
        assert await freed(ref, timeout_s=1.0), "the frames in a reference cycle were never freed"

    with collector_off():  # only the reclaimer's collection may free them
        asyncio.run(scenario())


def raw_body(*episodes) -> bytes:
    return raw_batch.encode([(ScoreOptions(task_text=TASK, nframes=n), f) for n, f in episodes]).tobytes()


def score_raw(url: str, content: bytes, timeout: float = 30):
    return post(
        f"{url}/score/batch", content=content, headers={"content-type": raw_batch.CONTENT_TYPE}, timeout=timeout
    )


def test_an_episode_larger_than_the_budget_is_a_413_naming_the_flag_and_the_others_are_scored():
    frames = episode_frames(16, size=224)  # 16 x 224 x 224 x 3 = 2.3 MB decoded: beyond a 2 MB budget
    with InProcessServer(max_decoded_mb=2) as s:
        r = score_raw(s.url, raw_body((16, frames), (4, episode_frames(8))))
        first, second = r.json()["results"]
        assert first["error"]["type"] == "decoded_too_large", first
        assert "--max-decoded-mb" in first["error"]["message"] and "2 MB" in first["error"]["message"]
        assert second["response"]["score"] is not None
        r = post(f"{s.url}/score", json={"task_text": TASK, "nframes": 16, "frames": inline(frames)})
        assert r.status_code == 413 and r.json()["error"]["type"] == "decoded_too_large", r.text
        # fewer frames fit: the message's advice works
        r = post(f"{s.url}/score", json={"task_text": TASK, "nframes": 8, "frames": inline(frames)})
        assert r.status_code == 200, r.text


def test_episodes_that_do_not_fit_together_wait_their_turn_and_the_peak_stays_within_the_budget():
    """Each episode takes 60% of the budget: they are all scored, one after another."""
    frames = episode_frames(16, size=224)
    size = decoded_bytes(16, 224, 224, 16, 200704, QWEN2_5_VL)
    budget_mb = size / 0.6 / MB
    with InProcessServer(max_decoded_mb=budget_mb, engine_option=["delay_ms=300"]) as s:
        with cf.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: score_raw(s.url, raw_body((16, frames))), range(3)))
        assert all("response" in a.json()["results"][0] for a in answers), [a.text for a in answers]
        st = stats(s.url)
        assert st["decoded_mb_peak"] == pytest.approx(size / MB, abs=0.01)  # never two at once
        assert st["decoded_mb_in_use"] == 0
        assert st["decoded_mb_budget"] == pytest.approx(budget_mb, abs=0.01)
        metrics = get(f"{s.url}/metrics").text
        assert "reward_decoded_mb_peak" in metrics and "reward_decoded_mb_budget" in metrics


def test_a_video_file_is_admitted_at_its_decoded_size_before_it_is_decoded(tmp_path):
    """The probe (frame count and size, nothing decoded) sizes the episode: a 40-frame 320x240 MP4
    at nframes 8 and the default max_pixels admits 8 frames of the resized size."""
    write_mp4(episode_frames(40, size=320)[:, :240], tmp_path / "ep.mp4")
    expected = decoded_bytes(40, 240, 320, 8, 200704, QWEN2_5_VL)
    with InProcessServer(video_roots=[str(tmp_path)], max_decoded_mb=64) as s:
        r = post(f"{s.url}/score", json={"task_text": TASK, "nframes": 8, "video_path": str(tmp_path / "ep.mp4")})
        assert r.status_code == 200, r.text
        assert stats(s.url)["decoded_mb_peak"] == pytest.approx(expected / MB, abs=0.01)
    with InProcessServer(video_roots=[str(tmp_path)], max_decoded_mb=expected / MB / 2) as s:
        r = post(f"{s.url}/score", json={"task_text": TASK, "nframes": 8, "video_path": str(tmp_path / "ep.mp4")})
        assert r.status_code == 413 and "--max-decoded-mb" in r.json()["error"]["message"], r.text
        assert stats(s.url)["decoded_mb_peak"] == 0  # refused before anything was decoded


def image_parts(count: int, size: int, seed: int = 0) -> list[dict]:
    """`count` different PNG images of size x size, as data URLs."""
    return [
        image_part(data_url(png_bytes(episode_frames(1, size=size, seed=seed + i)[0]), "image/png"))
        for i in range(count)
    ]


def seen_bytes(request) -> int:
    """Bytes of the model-ready media an engine request carried (what the budget must have counted)."""
    return sum(m.nbytes for m in request.images) + (request.video.nbytes if request.video is not None else 0)


def test_a_chat_requests_images_and_video_are_taken_from_the_budget_until_its_answer_is_done(tmp_path):
    """Images of three sizes (data: and file:// URLs) and an MP4 video_url: the budget counts what
    the engine is given (after the resize), while the answer is made, and nothing after it."""
    img = episode_frames(1, size=300, seed=3)[0]
    (tmp_path / "frame.png").write_bytes(png_bytes(img))
    video = {"type": "video_url", "video_url": {"url": data_url(mp4_bytes(episode_frames(40, size=96)), "video/mp4")}}
    parts = [*image_parts(2, 500), image_part(f"file://{tmp_path / 'frame.png'}"), *image_parts(1, 64), video]
    with InProcessServer(video_roots=[str(tmp_path)], max_decoded_mb=64, engine_option=["token_ms=50"]) as s:
        r = post(f"{s.url}{CHAT}", json={**chat_body(*parts), "max_tokens": 1})
        assert r.status_code == 200, r.text
        (seen,) = s.engine.seen
        assert len(seen.images) == 4 and seen.video is not None
        expected = seen_bytes(seen)
        st = stats(s.url)
        assert st["decoded_mb_peak"] == pytest.approx(expected / MB, abs=0.001), (st, expected)
        assert st["decoded_mb_in_use"] == 0
        # held while the engine works on it; given back when the client leaves
        sock = send_without_waiting(s.url, CHAT, {**chat_body(*parts), "max_tokens": 200})
        try:
            assert wait_until(lambda: s.engine.stats.running == 1, timeout=10)
            assert stats(s.url)["decoded_mb_in_use"] == pytest.approx(expected / MB, abs=0.001)
        finally:
            sock.close()
        assert wait_until(lambda: stats(s.url)["decoded_mb_in_use"] == 0, timeout=5)


def mp4_bytes(frames: np.ndarray) -> bytes:
    from reward_client.video_io import encode_mp4

    return encode_mp4(frames, fps=10)


def test_a_chat_request_beyond_the_whole_budget_is_a_413_naming_the_flag_and_nothing_is_decoded():
    """16 images of 512x512 (12 MB model-ready) under a 4 MB budget. The last image's header is
    whole but its pixel data is not: decoding it would be a 400 invalid_image, so the 413 shows
    the request was refused before anything was decoded."""
    broken = png_bytes(episode_frames(1, size=512, seed=99)[0])
    broken = broken[: len(broken) // 2]
    parts = [*image_parts(15, 512), image_part(data_url(broken, "image/png"))]
    with InProcessServer(max_decoded_mb=4, max_images_per_request=16) as s:
        err = openai_error(post(f"{s.url}{CHAT}", json=chat_body(*parts)), 413, "decoded_too_large")
        assert err["param"] == "messages", err
        assert "--max-decoded-mb" in err["message"] and "4 MB" in err["message"] and "16 image" in err["message"]
        assert stats(s.url)["decoded_mb_peak"] == 0 and s.engine.seen == []
        # within the budget, the broken image is found when decoding (it was never reached above)
        err = openai_error(post(f"{s.url}{CHAT}", json=chat_body(*parts[-2:])), 400, "invalid_image")
        assert err["param"] == "messages[0].content[1].image_url.url", err


def test_concurrent_chat_requests_over_the_budget_are_served_in_turn_within_it():
    """Each request's images take 60% of the budget: four sent at once are all answered, one
    holding its images at a time."""
    parts = image_parts(6, 256)
    size = 6 * 252 * 252 * 3  # six 256x256 images on the model's 28-pixel grid
    budget_mb = size / 0.6 / MB
    with InProcessServer(max_decoded_mb=budget_mb, engine_option=["delay_ms=200"]) as s:
        with cf.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post(f"{s.url}{CHAT}", json=chat_body(*parts), timeout=60), range(4)))
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        assert all(seen_bytes(seen) == size for seen in s.engine.seen)
        st = stats(s.url)
        assert st["decoded_mb_peak"] == pytest.approx(size / MB, abs=0.001)  # never two at once
        assert st["decoded_mb_peak"] <= budget_mb and st["decoded_mb_in_use"] == 0


def test_an_image_that_changed_after_its_probe_is_refused():
    """A file:// image replaced between the probe (which sized its share) and the decode."""
    png = png_bytes(episode_frames(1, size=64)[0])
    with pytest.raises(ImageError, match="changed while it was read") as exc:
        decode_image(png, DecodeLimits(), QWEN2_5_VL, "messages[0].content[0].image_url.url", Probe(1, 32, 64))
    assert exc.value.param == "messages[0].content[0].image_url.url"
    assert decode_image(png, DecodeLimits(), QWEN2_5_VL, "", Probe(1, 64, 64)).shape == (56, 56, 3)


def two_views(steps: int, size: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"main camera": episode_frames(steps, size, seed), "wrist camera": episode_frames(steps, size, seed + 1)}


def views_body(frames: dict[str, np.ndarray], nframes: int) -> dict:
    views = [{"name": name, "frames": inline(f)} for name, f in frames.items()]
    return {"task_text": TASK, "nframes": nframes, "views": views}


def test_an_episode_whose_views_together_exceed_the_budget_is_a_413_at_once_naming_its_size():
    """Three views of 1.2 MB each under a 2 MB budget: every view fits alone, the episode does not.
    Before, each view took its own share: the third waited for the first two, held by the same
    episode, and the answer was a retryable deadline_exceeded after the whole timeout."""
    views = {**two_views(8, 224), "top camera": episode_frames(8, 224, seed=5)}
    size = 3 * decoded_bytes(8, 224, 224, 8, 200704, QWEN2_5_VL)
    with InProcessServer(max_decoded_mb=2, request_timeout_s=10) as s:
        t0 = time.monotonic()
        r = post(f"{s.url}/score", json=views_body(views, 8))
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["type"] == "decoded_too_large" and not error["retryable"], error
        assert f"{-(-size // MB)} MB" in error["message"] and "3 views" in error["message"], error
        assert "budget of 2 MB (--max-decoded-mb)" in error["message"], error
        assert time.monotonic() - t0 < 5
        assert stats(s.url)["decoded_mb_peak"] == 0  # refused before any view was taken
        # raw: that item's error, the other item scored
        r = score_raw(
            s.url,
            raw_batch.encode(
                [
                    (ScoreOptions(task_text=TASK, nframes=8), views),
                    (ScoreOptions(task_text=TASK, nframes=4), episode_frames(4)),
                ]
            ).tobytes(),
        )
        first, second = r.json()["results"]
        assert first["error"]["type"] == "decoded_too_large" and second["response"]["score"] is not None, r.text


def test_two_view_episodes_that_each_fit_alone_are_scored_in_turn_not_deadlocked():
    """Two 2-view episodes, each 77% of the budget, in one JSON batch and in one raw batch: one at
    a time, both scored. Before, each took its first view's share and waited forever for its
    second (the JSON batch: both episodes' frames are ready at once)."""
    a, b = two_views(4, 112, seed=0), two_views(4, 112, seed=10)
    episode = 2 * decoded_bytes(4, 112, 112, 4, 200704, QWEN2_5_VL)
    budget_mb = episode / 0.77 / MB
    with InProcessServer(max_decoded_mb=budget_mb, request_timeout_s=10, engine_option=["delay_ms=100"]) as s:
        t0 = time.monotonic()
        r = post(f"{s.url}/score/batch", json={"requests": [views_body(v, 4) for v in (a, b)]}, timeout=15)
        assert [bool(item["response"]) for item in r.json()["results"]] == [True, True], r.text
        assert time.monotonic() - t0 < 5
        r = score_raw(s.url, raw_batch.encode([(ScoreOptions(task_text=TASK, nframes=4), v) for v in (a, b)]).tobytes())
        assert [bool(item["response"]) for item in r.json()["results"]] == [True, True], r.text
        st = stats(s.url)
        assert st["decoded_mb_peak"] == pytest.approx(episode / MB, abs=0.001)  # never two at once
        assert st["decoded_mb_in_use"] == 0


def test_many_two_view_episodes_score_as_fast_as_the_same_bytes_in_one_view_episodes():
    """16 two-view episodes (24 MB decoded) under a 10 MB budget, against 32 one-view episodes of
    the same frames; inline, in one batch each. Before, the two-view batch scored nothing (13
    episodes held one view each, none could take its second) and ended at the deadline."""
    frames = [episode_frames(4, 252, seed=i) for i in range(32)]
    options = ScoreOptions(task_text=TASK, nframes=4)
    one = [{**options.model_dump(exclude_none=True), "frames": inline(f)} for f in frames]
    two = [views_body({"main camera": frames[2 * i], "wrist camera": frames[2 * i + 1]}, 4) for i in range(16)]
    per_view = decoded_bytes(4, 252, 252, 4, 200704, QWEN2_5_VL)
    with InProcessServer(max_decoded_mb=10, request_timeout_s=10, engine_option=["delay_ms=20"]) as s:
        took = {}
        for name, requests in (("one view", one), ("two views", two)):
            t0 = time.monotonic()
            r = post(f"{s.url}/score/batch", json={"requests": requests}, timeout=30)
            took[name] = time.monotonic() - t0
            assert r.status_code == 200, r.text
            scored = [item for item in r.json()["results"] if item.get("response")]
            assert len(scored) == len(requests), (name, r.text[:500])
        assert took["two views"] < 5, took
        st = stats(s.url)
        assert st["decoded_mb_peak"] <= 10 and st["decoded_mb_peak"] >= 2 * per_view / MB, st
        assert st["decoded_mb_in_use"] == 0
