#!/usr/bin/env python3
"""What a taught classifier saves, and what labeling costs beyond the judge.

    python -m reward_tools.benchmarks.reward_model classifier [--device cpu] [--sizes 64,224] [--batches 1,8,64]
    python -m reward_tools.benchmarks.reward_model judge --url URL [--episodes 32] [--batch 16] [--nframes 16]
        [--size 256]
    python -m reward_tools.benchmarks.reward_model overhead --url URL [--episodes 64] [--batch 16] [--rounds 3]

classifier: RLinf's reward classifier's shape (ResNet18 with a 256-unit MLP head, frames resized
to 224x224 and normalized as its `preprocess_images` does; built from torchvision here, random
weights) scoring frames in batches: milliseconds per frame, the dense per-step reward's price.
judge: episodes of --nframes frames sent to a reward server in raw batches of --batch through the
hook's client: seconds per episode, the judge's price.
overhead: the same collected episodes (RLinf main's pickle layout, written once) labeled by
`python -m reward_tools.label_episodes` and sent by the hook's client alone (the frames the tool
would send, read into memory beforehand), in turns; the tool's wall time (reading, judging,
labeling, writing train.pt/val.pt) over the client's, per round and the median.

Prints one JSON object (also to --out).
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _client(url: str):
    """The hook's client (imported here: the classifier measurement runs where only torch is)."""
    from reward_client.client import RetryPolicy, RewardClient

    return RewardClient(url, RetryPolicy(deadline_s=3600, timeout_s=3600))


def classifier(args) -> dict:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torchvision import models

    torch.set_num_threads(args.threads) if args.threads else None
    device = torch.device(args.device)
    model = models.resnet18(weights=None)
    model.fc = nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Dropout(0.0), nn.Linear(256, 1))
    model = model.to(device).eval()
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)

    def reward(frames: torch.Tensor) -> torch.Tensor:  # uint8 [B, H, W, 3], as env observations come
        x = frames.to(device).permute(0, 3, 1, 2).float() / 255.0
        x = F.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False)
        with torch.no_grad():
            out = torch.sigmoid(model((x - mean) / std).squeeze(-1))
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    rows = []
    for size in args.sizes:
        for batch in args.batches:
            frames = torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8)
            for _ in range(args.warmup):
                reward(frames)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                reward(frames)
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1000
            rows.append({"frame_size": size, "batch": batch, "ms_per_batch": ms, "ms_per_frame": ms / batch})
            logging.info("classifier %dx%d batch %d: %.3f ms/frame", size, size, batch, ms / batch)
    return {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}


def _episodes(n: int, nframes: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (nframes, size, size, 3), dtype=np.uint8) for _ in range(n)]


def judge(args) -> dict:
    from reward_protocol.score import ScoreOptions

    client = _client(args.url)
    health = client.wait_until_ready(600)
    options = ScoreOptions(task_text="pick up the red cube", nframes=args.nframes)
    warm = _episodes(args.batch, args.nframes, args.size, seed=1)
    client.score_episodes([(options, f) for f in warm])
    episodes = _episodes(args.episodes, args.nframes, args.size)
    t0 = time.perf_counter()
    failed = 0
    for i in range(0, len(episodes), args.batch):
        items = client.score_episodes([(options, f) for f in episodes[i : i + args.batch]])
        failed += sum(item.response is None for item in items)
    wall = time.perf_counter() - t0
    client.close()
    return {
        "server": health.model_dump(exclude={"frame_spec", "score_modes"}),
        "episodes": args.episodes,
        "batch": args.batch,
        "nframes": args.nframes,
        "frame_size": args.size,
        "wall_s": wall,
        "s_per_episode": wall / args.episodes,
        "failed": failed,
    }


def _write_pickles(root: Path, n: int, steps: int, size: int) -> None:
    """Episodes in RLinf main's CollectEpisode layout (numpy frames; a leading reset entry)."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for e in range(n):
        success = e % 2 == 0
        frames = rng.integers(0, 256, (steps + 1, size, size, 3), dtype=np.uint8)
        obs = [{"main_images": torch.from_numpy(f), "task_descriptions": "pick up the red cube"} for f in frames]
        infos = [{}] + [{"success": torch.tensor(success and s > steps // 2)} for s in range(1, steps + 1)]
        data = {"success": success, "observations": obs, "infos": infos, "actions": [], "rewards": []}
        with open(root / f"rank_0_env_{e}_episode_0_step_{steps}_{'success' if success else 'fail'}.pkl", "wb") as f:
            pickle.dump(data, f)


def overhead(args) -> dict:
    from reward_protocol.frames import QWEN2_5_VL
    from reward_protocol.score import ScoreOptions
    from reward_tools import label_episodes
    from reward_tools.episode_files import find_episodes, read_episode
    from reward_tools.frame_labels import judge_picks

    work = Path(tempfile.mkdtemp(prefix="bench_label_"))
    episodes_dir = work / "collected"
    _write_pickles(episodes_dir, args.episodes, args.steps, args.size)
    client = _client(args.url)
    health = client.wait_until_ready(600)
    form, paths = find_episodes(episodes_dir)

    def client_alone() -> float:
        # what the tool sends, read beforehand: the judge's time alone
        sent = []
        for path in paths:
            ep = read_episode(form, path, episodes_dir)
            picks = judge_picks(QWEN2_5_VL, args.nframes, len(ep.frames))
            sent.append((ScoreOptions(task_text=ep.task, nframes=args.nframes), ep.frames[picks]))
        t0 = time.perf_counter()
        for i in range(0, len(sent), args.batch):
            client.score_episodes(sent[i : i + args.batch])
        return time.perf_counter() - t0

    def tool(round_: int) -> tuple[float, dict]:
        out = work / f"labeled_{round_}"
        t0 = time.perf_counter()
        argv = ["--url", args.url, "--episodes", str(episodes_dir), "--out", str(out), "--rule", "score"]
        argv += ["--batch-size", str(args.batch), "--nframes", str(args.nframes)]
        code = label_episodes.main(argv)
        wall = time.perf_counter() - t0
        assert code == 0, code
        return wall, json.loads((out / "agreement.json").read_text())["timing"]

    client_alone()  # warm both paths once
    tool(-1)
    rounds = []
    for r in range(args.rounds):
        if r % 2:
            t_tool, timing = tool(r)
            t_client = client_alone()
        else:
            t_client = client_alone()
            t_tool, timing = tool(r)
        rounds.append({"client_s": t_client, "tool_s": t_tool, "ratio": t_tool / t_client, "tool_timing": timing})
        logging.info("round %d: client %.2f s, tool %.2f s (%.3fx)", r, t_client, t_tool, t_tool / t_client)
    client.close()
    return {
        "server": health.model_dump(exclude={"frame_spec", "score_modes"}),
        "episodes": args.episodes,
        "steps": args.steps,
        "frame_size": args.size,
        "nframes": args.nframes,
        "batch": args.batch,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["classifier", "judge", "overhead"])
    p.add_argument("--url")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 224])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--nframes", type=int, default=16)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="overhead: frames per collected episode (after reset)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--note", help="recorded as is (e.g. how the server was started)")
    p.add_argument("--out")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.what != "classifier" and not args.url:
        p.error(f"{args.what} needs --url")
    result = {"what": args.what, "note": args.note, "argv": sys.argv[1:]}
    result["host"] = {"machine": platform.machine(), "python": platform.python_version()}
    result.update({"classifier": classifier, "judge": judge, "overhead": overhead}[args.what](args))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
