"""The decoded-memory budget under a burst of large videos: within the budget, nothing left behind."""

from __future__ import annotations

import concurrent.futures as cf
import time

import psutil
import pytest

from reward_client.video_io import write_mp4
from reward_protocol.frames import QWEN2_5_VL
from reward_protocol.score import MAX_MAX_PIXELS
from reward_server.media.decoded_budget import decoded_bytes
from reward_tools.decoded_memory import synthetic_video
from reward_tools.launch import ServerProcess
from tests.helpers.servers import post, stats

TASK = "put the bowl on the plate"

MB = 2**20


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
