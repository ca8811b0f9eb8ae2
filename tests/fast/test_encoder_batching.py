"""engines/vllm_encoder_batching: a step's encoder inputs ordered by modality (fast tier).

The ordering itself is checked here on plain lists; that vLLM gives the same answers with it on and
off is measured on a GPU (`FIDELITY_GEN=32 bash scripts/gpu/profile_gpu.sh ab`: PRIMO-R1's answers
of exactly 32 greedy tokens both ways)."""

from __future__ import annotations

from reward_server.engines.vllm.encoder_batching import batch_runner_by_modality, by_modality


def _step(n: int) -> tuple[list, list, list]:
    """A step starting n PRIMO-R1 episodes: [image, video, image] each, as vLLM lists them."""
    hashes, kwargs, refs = [], [], []
    for r in range(n):
        for k, modality in enumerate(("image", "video", "image")):
            hashes.append(f"r{r}-{k}")
            kwargs.append((modality, {"item": f"r{r}-{k}"}))
            refs.append((f"r{r}", k))
    return hashes, kwargs, refs


def test_items_of_one_modality_become_adjacent_in_their_order():
    hashes, kwargs, refs = by_modality(*_step(3))
    assert [m for m, _ in kwargs] == ["image"] * 6 + ["video"] * 3  # 2 encoder calls, not 7
    assert hashes == ["r0-0", "r0-2", "r1-0", "r1-2", "r2-0", "r2-2", "r0-1", "r1-1", "r2-1"]
    # the three lists stay parallel: each id keeps its own data and placement
    assert all(d["item"] == h for h, (_, d) in zip(hashes, kwargs, strict=True))
    assert all(h.startswith(r) for h, (r, _) in zip(hashes, refs, strict=True))


def test_one_modality_is_left_as_it_is():
    step = ([f"v{i}" for i in range(3)], [("video", {}) for _ in range(3)], [("r", i) for i in range(3)])
    assert by_modality(*step) == step


class _Runner:
    """Stands in for vLLM's model runner (its step's encoder-input lister, nothing else)."""

    def __init__(self) -> None:
        self.calls = 0

    def _batch_mm_inputs_from_scheduler(self, scheduler_output):
        self.calls += 1
        return _step(scheduler_output)


def test_runner_patched_once_and_runners_without_the_step_left_alone():
    runner = _Runner()
    assert batch_runner_by_modality(runner) and batch_runner_by_modality(runner)  # twice: no double wrap
    hashes, kwargs, _ = runner._batch_mm_inputs_from_scheduler(2)
    assert runner.calls == 1 and [m for m, _ in kwargs] == ["image"] * 4 + ["video"] * 2
    assert hashes[:2] == ["r0-0", "r0-2"]
    assert batch_runner_by_modality(object()) is False
