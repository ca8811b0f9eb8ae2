"""RLinf main's own API reward worker (`reward.worker_type: api`, EmbodiedAPIRewardWorker) against
this server, with no patch: the ready configs in configs/rlinf/main/*_api.yaml composed by Hydra on
RLinf main, the worker's real `__init__`, `init_worker` and `compute_reward` (input builder, HTTP
client, trend parser) and the env worker's own reward-input code with RLinf's HistoryManager, run
in the simulator environment by tests/rlinf_api_driver.py (its docstring says what is stood in:
Ray's worker base and placement, CUDA device calls, the channel between the two workers).

The fast part uses the fake engine (in process, so the requests the worker sent are read back):
the windows, labels and env mapping, what each request carries, the empty-window StopIteration
that docs/rlinf.md tells users to avoid, and the 503 the worker turns into a crash when the
server's queue is shorter than the envs. The engine part sends the same windows to vLLM on the
tiny checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers.rlinf import LIBERO_VENV
from tests.helpers.servers import InProcessServer

# a libero test (its folder marks it): the simulator environment holds RLinf's dependencies
REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "rlinf_api_driver.py"
CONFIGS = REPO / "configs" / "rlinf" / "main"
LABELS = "negative,unclear,positive"  # the fake engine's answer_words: dark, middle, bright last frame
POSITIVE, NEGATIVE, UNCLEAR = 1.0, -0.2, 0.0
ENVS, STEPS, WINDOW = 4, 9, 5


@pytest.fixture(scope="module")
def simulator_python() -> str:
    python = LIBERO_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no simulator environment at {LIBERO_VENV}: run `bash scripts/setup_libero_env.sh`")
    # what RLinf main's workers import beyond RLinf 0.3.0's (scripts/setup_rlinf_main.sh installs them)
    if subprocess.run([str(python), "-c", "import aiohttp, sortedcontainers"], capture_output=True).returncode:
        pytest.fail(
            f"{LIBERO_VENV} lacks aiohttp or sortedcontainers (RLinf main imports them): scripts/setup_rlinf_main.sh"
        )
    return str(python)


def drive(python: str, rlinf_main: Path, config: str, checkpoint: str, name: str, out: Path, *flags: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{rlinf_main}{os.pathsep}{REPO}", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [python, str(DRIVER), "--rlinf-dir", str(rlinf_main), "--config", str(CONFIGS / config)]
    cmd += ["--model-path", checkpoint, "--model-name", name, "--out", str(out), "--envs", str(ENVS)]
    cmd += ["--steps", str(STEPS), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=out.parent)
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def expected_labels(step: int) -> list[float]:
    """Env i's frames are bright, dark, middle, bright...; env 0 ends at step 6, so from step 7 it
    has no full window; nobody has one before step 5."""
    if step < WINDOW:
        return [0.0] * ENVS
    labels = [(POSITIVE, NEGATIVE, UNCLEAR)[i % 3] for i in range(ENVS)]
    if step > 6:
        labels[0] = 0.0
    return labels


@pytest.mark.parametrize(
    ("config", "layout"),
    [
        ("libero_10_grpo_openvlaoft_api.yaml", "libero"),
        ("libero_spatial_grpo_starvla_api.yaml", "libero"),
        ("maniskill_ppo_mlp_api.yaml", "maniskill"),
    ],
)
def test_rlinf_main_api_worker_scores_windows_through_this_server(
    config, layout, simulator_python, rlinf_main, tiny_checkpoint, tmp_path
):
    name = Path(tiny_checkpoint).name
    with (
        InProcessServer(
            model_path=tiny_checkpoint, engine_option=[f"answer_words={LABELS}"], max_queue=ENVS, decode_workers=1
        ) as s,
        InProcessServer(engine_option=["delay_ms=400"], served_model_name=name, max_queue=ENVS // 2) as small,
    ):
        out = drive(
            simulator_python,
            rlinf_main,
            config,
            tiny_checkpoint,
            name,
            tmp_path / "result.json",
            "--layout",
            layout,
            "--scenario",
            f"windows={s.url}",
            "--scenario",
            f"episode={s.url}",
            "--scenario",
            f"overload={small.url}",
        )
        seen = list(s.engine.seen)
    windows = out["windows"]
    assert windows["model_name"] == name and windows["history_buffers"] == ["history_window"]
    # RLinf's labels per env and step, through its parser: the window's last frame decides here
    for step in windows["steps"]:
        assert step["rewards"] == pytest.approx(expected_labels(step["step"])), step
    # one request per env with a full window, none before: 0 x 4, then 4, 4, then 3 (env 0 restarted)
    assert [s["requests"] for s in windows["steps"]] == [0] * 4 + [4, 4, 3, 3, 3]
    assert len(seen) == 17  # the episode scenario fails before its first request
    for request in seen:
        assert len(request.images) == WINDOW * 2  # 5 frames of each of the two views, as JPEG data URLs
        assert request.video is None
        (text,) = request.chat.texts()
        assert "Answer with exactly one word: positive, negative, or unclear." in text
        assert (request.sampling.max_tokens, request.sampling.temperature) == (16, 0.0)  # reward.api.sampling_params
    # an episode-sized window with input_on_done: the first step where no env ended has no window
    # at all, and the worker's compute_reward raises StopIteration (docs/rlinf.md says what avoids it)
    assert out["episode"]["step"] == 1 and out["episode"]["exception"][0] == "StopIteration"
    assert "next(iter(history_input.values()))" in out["episode"]["message"]
    # a queue shorter than the envs: the server answers 503 + Retry-After, the worker does not retry
    # and its step fails (the server's --max-queue must hold total_num_envs)
    assert out["overload"]["step"] == WINDOW and out["overload"]["exception"][0] == "RuntimeError"
    assert "status=503" in out["overload"]["message"] and "overloaded" in out["overload"]["message"]


@pytest.mark.engine
def test_rlinf_main_api_worker_against_vllm_on_the_tiny_checkpoint(
    simulator_python, rlinf_main, tiny_checkpoint, vllm_server, tmp_path
):
    """The same windows to vLLM: every request answered (the step would fail otherwise), 10 images
    each within --max-images-per-request, the noise parsed by RLinf into its three levels or its
    invalid reward (0)."""

    def chat_ok() -> float:
        text = httpx.get(f"{vllm_server.url}/metrics", timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("reward_chat_requests_total{")
        )

    name = httpx.get(f"{vllm_server.url}/v1/models", timeout=30).json()["data"][0]["id"]
    before = chat_ok()
    out = drive(
        simulator_python,
        rlinf_main,
        "libero_10_grpo_openvlaoft_api.yaml",
        tiny_checkpoint,
        name,
        tmp_path / "result.json",
        "--scenario",
        f"windows={vllm_server.url}",
    )
    steps = out["windows"]["steps"]
    assert [s["requests"] for s in steps] == [0] * 4 + [4, 4, 3, 3, 3]
    assert chat_ok() - before == 17
    for step in steps:
        assert all(min(abs(r - level) for level in (POSITIVE, NEGATIVE, UNCLEAR)) < 1e-6 for r in step["rewards"]), step
