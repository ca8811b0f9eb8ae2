"""The decoded-memory budget (--max-decoded-mb, issue 30): every episode's decoded size is taken
from one budget before its frames are made, whatever carried them (raw batch, inline frames, a
video file); an episode that can never fit is a 413 naming the flag, one that must wait waits its
turn, and the budget is visible in /stats and /metrics. Fast tier, fake engine."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import time
import weakref

import numpy as np
import psutil
import pytest

from reward_client import raw_batch
from reward_client.frames import QWEN2_5_VL
from reward_client.protocol import MAX_MAX_PIXELS, ScoreOptions
from reward_client.video_io import write_mp4
from reward_server.decoded_budget import DecodedBudget, DecodedTooLarge, decoded_bytes
from reward_server.memory_release import Reclaimer
from reward_tools.decoded_memory import synthetic_video
from reward_tools.launch import ServerProcess
from tests.conftest import episode_frames, inline
from tests.servers import InProcessServer, get, post, stats

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


def test_frames_a_reference_cycle_keeps_are_freed_once_their_budget_is_given_back():
    """An exception's traceback keeps the locals of its frames (decoded pixels) in a cycle that
    only the collector frees; the reclaimer collects once enough decoded memory was given back."""

    async def scenario() -> None:
        budget = DecodedBudget(10, Reclaimer(threshold_bytes=MB, delay_s=0).released)
        lease = await budget.take(2 * MB)
        frames = np.zeros(2 * MB, np.uint8)
        alive = weakref.ref(frames)
        cycle: list = [frames]
        cycle.append(cycle)
        del frames, cycle
        lease.release()
        for _ in range(100):
            if alive() is None:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the frames in a reference cycle were never freed")

    gc.disable()  # only the reclaimer's collection may free them
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()


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


@pytest.mark.slow
def test_a_burst_of_large_videos_stays_within_the_budget_and_leaves_nothing_behind(tmp_path):
    """Four items naming a 48-frame 720p MP4 at the largest max_pixels (135 MB decoded each) under
    a budget for two and a half: all scored, two at a time; the server process grows by no more
    than the budget (+10%) and keeps < 0.5 GiB once the answer is out."""
    video = tmp_path / "long_720p.mp4"
    write_mp4(synthetic_video(48, 720, 1280), video)
    per_item = decoded_bytes(48, 720, 1280, 48, MAX_MAX_PIXELS, QWEN2_5_VL)
    budget_mb = 2.5 * per_item / MB
    flags = ["--engine", "fake", "--engine-option", "seen_media=0", "--decode-workers", "2"]
    flags += ["--max-decoded-mb", f"{budget_mb:.1f}", "--video-root", str(tmp_path)]
    item = {"task_text": TASK, "video_path": str(video), "nframes": 48, "max_pixels": MAX_MAX_PIXELS}
    with ServerProcess(flags, log_path=tmp_path / "server.log") as server:
        server.wait_ready(60)
        proc = psutil.Process(server.proc.pid)
        baseline = proc.memory_info().rss
        peak = baseline
        with cf.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post, f"{server.url}/score/batch", json={"requests": [item] * 4}, timeout=120)
            while not answer.done():
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.02)
        results = answer.result().json()["results"]
        assert all("response" in r for r in results), results
        st = stats(server.url)
        assert st["decoded_mb_peak"] == pytest.approx(2 * per_item / MB, abs=0.01)  # two at a time
        assert peak - baseline <= 1.1 * budget_mb * MB, (peak - baseline) / MB
        time.sleep(3)  # the reclaimer runs shortly after the frames are given back
        kept = proc.memory_info().rss - baseline
        assert kept < 0.5 * 2**30, kept / MB
