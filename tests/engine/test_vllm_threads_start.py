"""The vLLM engine's start asks torch about CUDA only once vLLM is imported (engines/vllm/threads.py).

Importing vLLM puts torch's CUDA check in NVML mode (PYTORCH_NVML_BASED_CUDA_CHECK=1). Asked
before, the check initializes CUDA's driver in the server, and on a GPU the engine core forked from
it fails with "Cannot re-initialize CUDA in forked subprocess" (issue 40, sixth round: a server
that never started). There is no CUDA here, so the test records the check's mode when start()
first asks, and stops start() there (in a child process: vLLM's import sets the environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.scripts import failure_text

ROOT = Path(__file__).resolve().parents[2]


def test_start_asks_about_cuda_only_after_vllm_set_nvml_mode(tmp_path, tiny_checkpoint):
    script = textwrap.dedent(
        f"""
        import asyncio, json, os, torch
        from reward_server.bootstrap import engine_config
        from reward_server.engines.vllm.engine import VllmEngine
        from reward_server.settings import ServerSettings

        class Asked(Exception):
            pass

        def is_available():
            raise Asked(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))

        torch.cuda.is_available = is_available
        try:  # the first question, whoever asks it: the settings' GPU defaults, or the engine's start
            engine = VllmEngine(engine_config(ServerSettings(engine="vllm", model_path={tiny_checkpoint!r})))
            asyncio.run(engine.start())
        except Asked as asked:
            print(json.dumps({{"nvml_mode": asked.args[0]}}))
        """
    )
    path = tmp_path / "start.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, failure_text(out.stderr)
    assert out.stdout.strip().splitlines()[-1] == '{"nvml_mode": "1"}', out.stdout + failure_text(out.stderr)
