#!/usr/bin/env python3
"""What judging costs a rollout epoch, synchronous and asynchronous, beside no judge at all.

    python -m reward_tools.benchmarks.async_rollout [--envs libero,maniskill] [--delay-ms 3000] [--repeats 5] \\
        [--out docs/bench/cpu_async_rollout_2026-11-25.json]

(--envs libero, then --envs maniskill: two shorter calls that fill the same --out file.)

One fake-engine reward server answers every batch request after --delay-ms (3 s: a batch of 64
at 7B shapes on one H100/H200 takes 2.4-3.8 s, docs/performance.md), so the judge's latency is
realistic and its compute is nothing. RLinf's real envs, patched as scripts/apply_rlinf_patches.sh
patches them, run in the simulator environment (LIBERO_VENV) and are stepped as RLinf's env
worker steps them: chunk steps, RLinf's own rollout buffer (EmbodiedRolloutResult), the patched
EnvWorker.place_vlm_rewards after every chunk step (where async mode waits, at the epoch's last
one). The policy is a fixed action (its inference would add the same time to every mode).

- LIBERO: the tiny runs' shape (2 envs on LIBERO-10, chunks of 4, no auto reset), an epoch of
  --libero-steps; env 0 reaches its goal at chunk 2 and env 1 at chunk 5 (their simulator state
  is set to the goal), so both episodes end well before the epoch's last step.
- ManiSkill: the tiny runs' shape (PickCube-v1, 1 env, CPU physics, 56x56 frames, chunks of 1,
  auto reset), episodes truncated every --maniskill-episode steps, an epoch of --maniskill-steps
  that ends before the next truncation. Each epoch starts with a reset of the env, so its
  episodes end at the same steps in every epoch.

The modes (no judge, sync, async) take turns, each warmed by one unmeasured epoch, then
--repeats measured epochs each. ManiSkill: an env object per mode, all in one process
(--maniskill-one-env: one, whose hook the modes swap). LIBERO:
one LiberoEnv whose hook the modes swap (none: RLinf's own reward, as with enable=False); each
LiberoEnv's simulator processes hold ~2.5 GB apiece, and three env objects in one process were
ended by the kernel's OOM killer on this 24 GB machine (seen as a crash in MuJoCo's EGL
rendering or a broken pipe). Each epoch is its reset (RLinf's bootstrap_step) plus its chunk
steps; both are recorded, with the CPU seconds each part of the setup used during the epoch
(the env's process, the hook's request threads, the simulator's processes, the reward server,
the whole machine: what the judge's requests take from the simulator on a small machine).
Prints the median epoch wall time per mode and the ratios to no judge; writes them (and every
epoch's numbers) as JSON. Bounded: every simulator process is killed after --timeout-s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("off", "sync", "async")
logger = logging.getLogger("bench_async_rollout")


# --- inside the simulator environment ------------------------------------------------------------


def _overrides(mode: str, url: str) -> list[str]:
    rm = "env.train.reward_model"
    return [
        f"{rm}.enable={mode != 'off'}",
        f"++{rm}.async={mode == 'async'}",
        f"{rm}.url={url}",
        f"{rm}.wait_ready_s=60",
        f"{rm}.score_mode=logprob",
    ]


def _epoch(env, worker, chunks: int, chunk: int, action, before_chunk) -> tuple[float, float]:
    """One rollout epoch's chunk steps as RLinf's env worker runs them: their wall time, and the
    part of it spent in the last chunk step's placement (where async mode waits for answers)."""
    from types import SimpleNamespace

    from rlinf.data.embodied_io_struct import ChunkStepResult, EmbodiedRolloutResult
    from rlinf.workers.env.env_worker import EnvWorker

    rollout = EmbodiedRolloutResult(max_episode_length=chunks * chunk)
    worker.rollout_results = [rollout]
    started = time.perf_counter()
    previous = None
    for k in range(chunks):
        if previous is not None:  # the worker appends a chunk's rewards at the next chunk step
            rollout.append_step_result(ChunkStepResult(rewards=previous.clone()))
        before_chunk(k)
        _, rewards, terms, truncs, infos_list = env.chunk_step(action(k))
        dones = terms | truncs
        infos = infos_list[-1]
        if not env.auto_reset:  # env_interact_step: every env's episode metrics
            env_info = {key: v.cpu() for key, v in infos["episode"].items()}
        elif "final_info" in infos:  # auto reset: the rows of the envs done at the chunk's last step
            env_info = {key: v[dones[:, -1]].cpu() for key, v in infos["final_info"]["episode"].items()}
        else:
            env_info = {}
        placing = time.perf_counter()
        EnvWorker.place_vlm_rewards(worker, 0, SimpleNamespace(rewards=rewards, dones=dones), k, env_info)
        last_place_s = time.perf_counter() - placing
        previous = rewards
    rollout.append_step_result(ChunkStepResult(rewards=previous.clone()))
    return time.perf_counter() - started, last_place_s


def drive_libero(args) -> dict:
    from types import SimpleNamespace

    import numpy as np
    from rlinf.envs.libero.libero_env import LiberoEnv

    from reward_client.rlinf.hook import VLMRewardHook
    from reward_tools.libero_sim import compose_env_config, goal_state

    chunk, chunks = 4, args.libero_steps // 4
    goals = {2: 0, 5: 1}  # chunk -> the env that reaches its goal then
    # One LiberoEnv whose hook the modes swap (no hook: RLinf's own reward, as with enable=False).
    # A LiberoEnv per mode does not fit: each of its simulator processes holds ~2.5 GB, and three
    # env objects of 2 envs (6 of them, plus the driver) made the kernel's OOM killer end one,
    # which surfaced as a broken pipe or a crash inside MuJoCo's EGL rendering.
    base = ["env.train.group_size=1", f"env.train.max_episode_steps={args.libero_steps}"]
    base.append("+env.train.task_id_filter=[0]")
    cfgs = {m: compose_env_config(args.config_dir, "runB_qwen", base + _overrides(m, args.url)) for m in MODES}
    env = LiberoEnv(cfgs["sync"], num_envs=2, seed_offset=0, total_num_processes=1, worker_info=None)
    hooks = {"off": None, "sync": env.vlm_reward, "async": VLMRewardHook.from_rlinf_config(cfgs["async"], 2)}
    worker = SimpleNamespace(env_list=[env], rollout_results=[], n_train_chunk_steps=chunks)
    states: dict[int, np.ndarray] = {}

    def run(mode: str) -> tuple[float, float, float]:
        env.vlm_reward = hooks[mode]
        env.is_start = True  # RLinf's bootstrap_step: a reset of every env
        reset_started = time.perf_counter()
        env.reset()
        reset_s = time.perf_counter() - reset_started

        def before_chunk(k: int) -> None:
            if k in goals:
                e = goals[k]
                if e not in states:  # in the first (unmeasured) warm-up epoch, as the test driver makes them
                    states[e] = goal_state(env, e)
                env.env.set_init_state(init_state=[states[e]], id=[e])

        def action(k: int):
            a = np.zeros((2, chunk, 7))
            for e, goal_chunk in ((e, c) for c, e in goals.items()):
                if k < goal_chunk:  # the arm moves until its goal state is set, then rests
                    a[e, :, 0] = 0.3 * np.sin(np.arange(chunk) + k)
            return a

        return reset_s, *_epoch(env, worker, chunks, chunk, action, before_chunk)

    result = _take_turns(run, args.repeats, list(MODES), args.server_pid)
    result["hooks"] = {m: _hook_facts(h) for m, h in hooks.items()}
    env.env.close()
    return result


def drive_maniskill(args) -> dict:
    from types import SimpleNamespace

    import torch
    from hydra import compose, initialize_config_dir
    from rlinf.envs.maniskill.maniskill_env import ManiskillEnv

    os.environ.setdefault("EMBODIED_PATH", os.path.dirname(args.config_dir))
    chunks = args.maniskill_steps
    envs, workers = {}, {}
    cfgs = {}
    for mode in MODES:
        overrides = [
            "env.train.init_params.sim_backend=cpu",
            "+env.train.init_params.render_backend=cpu",
            "env.train.init_params.sensor_configs.width=56",
            "env.train.init_params.sensor_configs.height=56",
            f"env.train.max_episode_steps={args.maniskill_episode}",
            f"env.train.max_steps_per_rollout_epoch={args.maniskill_steps}",
            *_overrides(mode, args.url),
        ]
        with initialize_config_dir(config_dir=args.config_dir, version_base="1.1"):
            cfg = cfgs[mode] = compose(config_name="maniskill_ppo_mlp_runB_qwen", overrides=overrides).env.train
        if args.maniskill_one_env and envs:
            continue
        env = envs[mode] = ManiskillEnv(cfg, num_envs=1, seed_offset=0, total_num_processes=1, worker_info=None)
        workers[mode] = SimpleNamespace(env_list=[env], rollout_results=[], n_train_chunk_steps=chunks)
    adapters = {}
    if args.maniskill_one_env:  # one env object whose adapter the modes swap, as for LIBERO
        from reward_client.rlinf.env_adapters import ManiSkillAdapter

        env = envs["off"]
        adapters = {
            "off": None,
            "sync": ManiSkillAdapter(env, cfgs["sync"]),
            "async": ManiSkillAdapter(env, cfgs["async"]),
        }
        for mode in MODES:
            envs[mode], workers[mode] = env, workers["off"]
    width = envs["off"].env.action_space.shape[-1]

    def run(mode: str) -> tuple[float, float, float]:
        # every epoch starts its episodes afresh, so they end at the same steps of every epoch
        # (RLinf's auto reset lets them run on across epochs, wherever they then end)
        if adapters:
            envs[mode].vlm_reward = adapters[mode]
        started = time.perf_counter()
        envs[mode].reset()
        reset_s = time.perf_counter() - started
        action = torch.zeros((1, 1, width))
        return reset_s, *_epoch(envs[mode], workers[mode], chunks, 1, lambda k: action, lambda k: None)

    result = _take_turns(run, args.repeats, list(MODES), args.server_pid)
    held = adapters or {m: getattr(envs[m], "vlm_reward", None) for m in MODES}
    result["hooks"] = {m: _hook_facts(h) for m, h in held.items()}
    return result


def _hook_facts(hook) -> dict | None:
    if hook is None:
        return None
    hook = getattr(hook, "hook", hook)  # ManiSkill's adapter holds the hook
    latency = [float(v) for v in hook.latency_ms if v > 0]
    return {"counts": dict(hook.counts), "placed": hook.placed, "last_latency_ms": latency}


def _cpu_s(server_pid: int | None) -> dict[str, float]:
    """CPU seconds so far (user + system) of: this process's env thread and the rest of its threads
    but the hook's request threads; those request threads; its child processes (LIBERO's
    simulator processes); the reward server's process tree; and the whole machine (busy time of
    every core), whose remainder is what other jobs took."""
    import threading

    import psutil

    me = psutil.Process()
    request_ids = {t.native_id for t in threading.enumerate() if t.name.startswith("vlm-judge")}
    request = sum(t.user_time + t.system_time for t in me.threads() if t.id in request_ids)
    own = me.cpu_times()
    children = own.children_user + own.children_system  # reaped ones
    for child in me.children(recursive=True):
        try:
            children += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    server = 0.0
    if server_pid:
        try:
            root = psutil.Process(server_pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    server += sum(p.cpu_times()[:2])
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
    machine = psutil.cpu_times()
    busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq + machine.steal
    return {
        "env_process": own.user + own.system - request,
        "request_threads": request,
        "sim_processes": children,
        "server": server,
        "machine": busy,
    }


def _take_turns(run, repeats: int, modes: list[str], server_pid: int | None) -> dict:
    """run(mode) -> (reset_s, steps_s, final_wait_s) of one epoch. Every mode warmed by one unmeasured epoch,
    then `repeats` measured epochs each, the modes taking turns."""
    for mode in modes:
        run(mode)
    times: dict[str, list[float]] = {m: [] for m in modes}
    resets: dict[str, list[float]] = {m: [] for m in modes}
    steps: dict[str, list[float]] = {m: [] for m in modes}
    waits: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(repeats):
        order = modes if r % 2 == 0 else modes[::-1]  # drift on a shared machine falls on every mode
        for mode in order:
            before = _cpu_s(server_pid)
            reset_s, steps_s, wait_s = run(mode)
            after = _cpu_s(server_pid)
            used = {k: round(after[k] - before[k], 3) for k in before}
            used["other_jobs"] = round(used["machine"] - sum(v for k, v in used.items() if k != "machine"), 3)
            times[mode].append(reset_s + steps_s)
            resets[mode].append(reset_s)
            steps[mode].append(steps_s)
            waits[mode].append(wait_s)
            cpu[mode].append(used)
            logger.info(
                "%s epoch %d: %.2f s (reset %.2f s, final wait %.2f s) cpu %s",
                mode,
                r,
                times[mode][-1],
                reset_s,
                wait_s,
                used,
            )
    return {"epoch_s": times, "reset_s": resets, "steps_s": steps, "final_wait_s": waits, "cpu_s": cpu}


# --- the orchestrator, in the reward server's environment ----------------------------------------


def _rlinf_tree(venv: Path, work: Path) -> Path:
    """A patched copy of RLinf (the simulator environment's rlinf + the v0.3 examples), as
    scripts/run_tiny_experiments.sh makes it."""
    tree = work / "rlinf"
    examples = Path(os.environ.get("RLINF_EXAMPLES", ROOT.parent / "shared" / "rlinf_v0.3" / "examples"))
    package = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import os, rlinf; print(os.path.dirname(rlinf.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (tree / "examples").mkdir(parents=True)
    shutil.copytree(package, tree / "rlinf", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(examples / "embodiment", tree / "examples" / "embodiment")
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "apply_rlinf_patches.sh"), str(tree)], check=True, capture_output=True
    )
    return tree


def _sim_env(venv: Path, simulator: str) -> dict[str, str]:
    # as the tests' driver env: robosuite picks its EGL device by these (set for a GPU, or empty,
    # they name a device this machine's EGL may not have)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")},
        "LIBERO_CONFIG_PATH": str(venv / "libero_config"),
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
        "MUJOCO_GL": "egl",
        "PYOPENGL_PLATFORM": "egl",
        "PYTHONPATH": str(ROOT),
    }
    if simulator == "maniskill":  # SAPIEN on the CPU's Vulkan (lavapipe), as setup_maniskill_env.sh sets it up
        script = venv / "vulkan" / "env.sh"
        if script.exists():
            out = subprocess.run(["bash", "-c", f". {script} && env"], capture_output=True, text=True, check=True)
            env.update(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="libero,maniskill")
    parser.add_argument("--delay-ms", type=int, default=3000, help="the fake judge's time per batch request")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--libero-steps", type=int, default=64)
    parser.add_argument("--maniskill-steps", type=int, default=235)
    parser.add_argument("--maniskill-episode", type=int, default=80)
    parser.add_argument(
        "--maniskill-one-env", action="store_true", help="one ManiSkill env object whose hook the modes swap"
    )
    parser.add_argument("--timeout-s", type=int, default=540, help="per simulator process")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "cpu_async_rollout_2026-11-25.json"))
    # inside the simulator environment (the orchestrator starts these)
    parser.add_argument("--drive", choices=["libero", "maniskill"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--rlinf-dir", help=argparse.SUPPRESS)
    parser.add_argument("--config-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    if args.drive:
        sys.path.insert(0, args.rlinf_dir)  # the patched copy shadows the installed rlinf
        logging.getLogger("reward_client").setLevel(logging.WARNING)
        result = {"libero": drive_libero, "maniskill": drive_maniskill}[args.drive](args)
        Path(args.result).write_text(json.dumps(result))
        return

    from reward_tools.launch import ServerProcess

    venv = Path(os.environ.get("LIBERO_VENV", Path.home() / ".cache" / "reward_server" / "libero-venv"))
    if not (venv / "bin" / "python").exists():
        sys.exit(f"no simulator environment at {venv}: bash scripts/setup_libero_env.sh (or set LIBERO_VENV)")
    simulators = [s for s in args.envs.split(",") if s]
    report: dict = {
        "what": "rollout epoch wall time: no judge, sync judging, async judging (reward_model.async)",
        "judge": f"fake engine, {args.delay_ms} ms per batch request",
        "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "envs": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        work = Path(tmp)
        tree = _rlinf_tree(venv, work)
        flags = ["--engine", "fake", "--engine-option", f"delay_ms={args.delay_ms}"]
        server = ServerProcess(flags, log_path=work / "server.log")
        with server:
            server.wait_ready(120)
            for simulator in simulators:
                out = work / f"{simulator}.json"
                cmd = [str(venv / "bin" / "python"), __file__, "--drive", simulator, "--url", server.url]
                cmd += ["--rlinf-dir", str(tree), "--config-dir", str(tree / "examples" / "embodiment" / "config")]
                cmd += ["--result", str(out), "--repeats", str(args.repeats)]
                cmd += ["--libero-steps", str(args.libero_steps), "--maniskill-steps", str(args.maniskill_steps)]
                cmd += ["--maniskill-episode", str(args.maniskill_episode), "--server-pid", str(server.proc.pid)]
                cmd += ["--maniskill-one-env"] if args.maniskill_one_env else []
                started = time.perf_counter()
                subprocess.run(cmd, env=_sim_env(venv, simulator), check=True, timeout=args.timeout_s)
                result = json.loads(out.read_text())
                medians = {m: statistics.median(result["epoch_s"][m]) for m in MODES}
                steps = {m: statistics.median(result["steps_s"][m]) for m in MODES}
                result["median_s"] = medians
                result["ratio_to_off"] = {m: medians[m] / medians["off"] for m in MODES}
                result["median_steps_s"] = steps  # the epoch without its reset
                result["steps_ratio_to_off"] = {m: steps[m] / steps["off"] for m in MODES}
                result["median_final_wait_s"] = {m: statistics.median(result["final_wait_s"][m]) for m in MODES}
                result["median_cpu_s"] = {
                    m: {k: statistics.median(c[k] for c in result["cpu_s"][m]) for k in result["cpu_s"][m][0]}
                    for m in MODES
                }
                result["process_s"] = time.perf_counter() - started
                result["shape"] = (
                    {"envs": 2, "chunk": 4, "epoch_steps": args.libero_steps, "ends_at_chunks": [2, 5]}
                    if simulator == "libero"
                    else {
                        "envs": 1,
                        "chunk": 1,
                        "epoch_steps": args.maniskill_steps,
                        "episode": args.maniskill_episode,
                        "env_objects": 1 if args.maniskill_one_env else 3,
                    }
                )
                report["envs"][simulator] = result
    out = Path(args.out)
    if out.exists():  # one simulator per call keeps each call short: merge into the earlier calls' file
        earlier = json.loads(out.read_text())
        if earlier.get("judge") == report["judge"] and earlier.get("repeats") == report["repeats"]:
            report["envs"] = {**earlier.get("envs", {}), **report["envs"]}
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'env':10} {'no judge':>10} {'sync':>10} {'async':>10} {'sync/none':>10} {'async/none':>11}")
    for simulator, r in report["envs"].items():
        if simulator not in simulators:
            continue
        for label, m, x in (
            (simulator, r["median_s"], r["ratio_to_off"]),
            ("  (steps)", r["median_steps_s"], r["steps_ratio_to_off"]),
        ):
            row = f"{m['off']:9.2f}s {m['sync']:9.2f}s {m['async']:9.2f}s {x['sync']:10.3f} {x['async']:11.3f}"
            print(f"{label:10} {row}")
        for mode, cpu in r["median_cpu_s"].items():
            wait = r["median_final_wait_s"][mode]
            print(f"  {mode:5} final wait {wait:.2f} s; cpu s: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
    print(f"(median of {args.repeats} epochs each; judge: {args.delay_ms} ms per batch) -> {out}")


if __name__ == "__main__":
    main()
