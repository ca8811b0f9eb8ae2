"""engines/vllm/patches.py: every patch declared once, its typed options read under their names and
the older strings, the docs' table equal to the registry, Model Runner V2 named where it cannot
work; the checks of the patches that change numbers (vision MLP in the worker, the probe comparison)
and the step timing's null encoder times on a runner without V1's encoder method. The engine tier
(tests/engine/test_patch_registry.py) runs the table and the probes in a real vLLM."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from reward_server.engines.io import EngineOutput, TokenLogprob
from reward_server.engines.vllm import checks
from reward_server.engines.vllm.patches import (
    BY_NAME,
    PATCHES,
    V2_ENV,
    NeedsV1,
    PatchOptions,
    PatchStates,
    doc_table,
    explicit_runner,
    option_names,
    parse_options,
    refuse_on_v2,
    runner_of,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# the 15 option strings the engine read before the registry: each still works
OLD_STRINGS = {
    "step_log": "/tmp/s.jsonl",
    "gil_switch_ms": "1",
    "step_floor_ms": "10",
    "skip_cached_hf_call": "false",
    "curve_start": "prefilled",
    "curve_clip_ids": "false",
    "encoder_batching": "true",
    "freeze_engine_heap": "false",
    "pixels_in_model_dtype": "true",
    "normalize_on_device": "false",
    "profile_dir": "/tmp/p",
    "step_timing": "/tmp/t.jsonl",
    "torch_threads": "2",
    "preprocess_threads": "0",
    "vision_mlp_align": "true",
}


def test_the_docs_table_is_the_registrys():
    text = DOCS.read_text()
    found = re.search(r"<!-- patches:begin[^\n]*-->\n(.*?)\n<!-- patches:end -->", text, re.S)
    assert found, "docs/operations.md has no patches table between its markers"
    assert found.group(1) == doc_table(), "regenerate the table from patches.doc_table()"


def test_every_patch_declares_what_it_changes_where_it_was_measured_and_its_options():
    fields = set(PatchOptions.model_fields)
    owned = [o for p in PATCHES for o in p.options]
    assert sorted(owned) == sorted(fields), "every typed option belongs to exactly one patch"
    for p in PATCHES:
        assert p.changes and "\n" not in p.changes and p.measured_on and p.runners, p.name
        assert not p.numbers or p.check, f"{p.name} changes numbers and states no check"
    assert {p.name for p in PATCHES if p.numbers} == {"pixel_norm", "vision_mlp", "pixel_dtype"}
    assert BY_NAME["cache_hits"].retired_from == "0.32"


def test_the_old_option_strings_are_aliases_of_typed_options():
    typed = parse_options(OLD_STRINGS)
    assert typed.cache_hits is False and typed.heap is False and typed.pixel_norm is False
    assert typed.pixel_dtype is True and typed.vision_mlp is True and typed.encoder_batching is True
    assert typed.torch_threads == 2 and typed.input_threads == 0 and typed.step_floor_ms == 10.0
    assert typed.curve_start == "prefilled" and typed.curve_clip_ids is False
    assert set(OLD_STRINGS) <= option_names()
    # the patch's own name reads the same option; no option is left to vLLM's engine arguments
    assert parse_options({"pixel_norm": "off"}).pixel_norm is False
    assert parse_options({}).pixel_norm is None  # the device's default
    assert "max_num_seqs" not in option_names()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"normalize_on_device": "maybe"}, "--engine-option normalize_on_device=maybe: true or false"),
        ({"torch_threads": "0"}, "--engine-option torch_threads=0: a whole number of threads >= 1 is allowed"),
        ({"curve_start": "early"}, "--engine-option curve_start=early: handed or prefilled"),
        ({"step_floor_ms": "-1"}, "--engine-option step_floor_ms=-1: a number of milliseconds >= 0"),
        (
            {"pixel_norm": "true", "normalize_on_device": "false"},
            "--engine-option pixel_norm=true and --engine-option normalize_on_device=false set one option",
        ),
    ],
)
def test_a_bad_option_is_refused_with_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_options(options)


def test_the_cli_refuses_a_bad_patch_option_before_anything_starts(capsys):
    from reward_server import cli

    with pytest.raises(SystemExit) as exited:
        cli.parse_settings(["--model-path", "/nowhere", "--engine-option", "vision_mlp_align=sometimes"])
    assert exited.value.code == 2
    assert "vision_mlp_align=sometimes: true or false" in capsys.readouterr().err


def test_model_runner_v2_is_named_and_the_step_floor_refused_on_it():
    assert explicit_runner({}) is None and explicit_runner({V2_ENV: ""}) is None
    assert explicit_runner({V2_ENV: "0"}) == "V1" and explicit_runner({V2_ENV: "1"}) == "V2"
    assert runner_of(types.SimpleNamespace(use_v2_model_runner=True)) == "V2"
    assert runner_of(object()) == "V1"  # a vLLM without V2
    floor = parse_options({"step_floor_ms": "10"})
    refuse_on_v2(floor, "V1")
    refuse_on_v2(parse_options({}), "V2")
    with pytest.raises(NeedsV1, match=f"step_floor_ms=10 needs V1: .* set {V2_ENV}=0"):
        refuse_on_v2(floor, "V2")


def test_the_table_has_one_row_per_patch_and_names_the_runner():
    states = PatchStates()
    states.runner, states.vllm_version = "V2", "0.33.0"
    states.set("step_timing", "dormant", "needs V1's _execute_mm_encoder")
    table = states.table()
    assert table.splitlines()[0] == "vLLM 0.33.0, model runner V2: patches"
    assert len(table.splitlines()) == 2 + len(PATCHES)
    assert re.search(r"step_timing\s+dormant\s+needs V1's _execute_mm_encoder", table)
    row = next(r for r in states.as_list() if r["patch"] == "step_timing")
    assert json.loads(json.dumps(row))["state"] == "dormant"
    with pytest.raises(KeyError, match="no patch 'nope' is declared"):
        states.set("nope", "off", "")
    # applied outside what it was measured on (vLLM 0.33, V2): said so, beside the probe that let it run
    states.set("heap", "applied", "frozen once warm")
    assert "frozen once warm [outside its measured range: runs because its probe passed]" in states.table()
    states.runner, states.vllm_version = "V1", "0.24.1"
    assert states.measured_here("heap") and "outside" not in states.table()


def test_step_timing_on_a_runner_without_v1s_encoder_method_writes_null_not_zero(tmp_path):
    from reward_server.engines.vllm.step_timing import time_runner

    class RunnerV2:  # V2's model runner: execute_model and sample_tokens, no _execute_mm_encoder
        def execute_model(self, scheduler_output):
            if hasattr(self, "_execute_mm_encoder"):
                self._execute_mm_encoder()
            return "out"

        def sample_tokens(self, grammar):
            return "tokens"

    class RunnerV1(RunnerV2):
        def _execute_mm_encoder(self, *args):
            return []

    for runner, encoder in ((RunnerV2(), False), (RunnerV1(), True)):
        path = tmp_path / f"{encoder}.jsonl"
        assert time_runner(runner, str(path)) == {"timed": True, "encoder": encoder}
        runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=3, num_scheduled_tokens={"a": 3}))
        (row,) = [r for r in map(json.loads, path.read_text().splitlines()) if r["what"] == "execute"]
        assert (row["encoder_ms"], row["encoder_calls"]) == ((None, None) if not encoder else (row["encoder_ms"], 1))
        assert row["tokens"] == 3


def _logprobs(token: str, top: dict[str, float]) -> EngineOutput:
    return EngineOutput(token_logprobs=[TokenLogprob(token, top[token], tuple(top.items()))])


def test_the_probe_comparison_passes_rounding_and_names_a_difference():
    reference = _logprobs("a", {"a": -0.5, "b": -1.25, "c": -3.0})
    assert checks.differs(reference, _logprobs("a", {"a": -0.5005, "b": -1.25, "c": -3.001})) is None
    assert "differ by up to 0.05" in checks.differs(reference, _logprobs("a", {"a": -0.55, "b": -1.25, "c": -3.0}))
    assert "first token differs" in checks.differs(reference, _logprobs("b", {"b": -0.4, "a": -0.6, "c": -3.0}))
    assert "not in the patched path's" in checks.differs(reference, _logprobs("a", {"a": -0.5, "b": -1.25}))
    request = checks.probe_request("x")
    assert request.video.shape == (4, 56, 56, 3) and request.sampling.logprobs == checks.TOP
    assert request.video[0].std() > 0  # never a constant frame


torch = pytest.importorskip("torch")


class UnquantizedLinearMethod:  # the name vLLM's plain linear layers carry (vision_mlp._plain)
    pass


class _Linear(torch.nn.Linear):
    quant_method = UnquantizedLinearMethod()


class _Mlp(torch.nn.Module):
    """A vision MLP as vLLM lays it out, [gate; up] in one projection; `interleaved` is another
    layout (gate and up rows alternating), which the padding does not know."""

    def __init__(self, hidden: int, width: int, interleaved: bool = False):
        super().__init__()
        self.gate_up_proj = _Linear(hidden, 2 * width)
        self.down_proj = _Linear(width, hidden)
        self.interleaved = interleaved

    def forward(self, x):
        gated = self.gate_up_proj(x)
        if self.interleaved:
            gate, up = gated[..., 0::2], gated[..., 1::2]
        else:
            gate, up = gated.chunk(2, dim=-1)
        return self.down_proj(torch.nn.functional.silu(gate) * up)


def _model(interleaved: bool):
    torch.manual_seed(0)
    blocks = [types.SimpleNamespace(mlp=_Mlp(40, 100, interleaved)) for _ in range(2)]
    return types.SimpleNamespace(visual=types.SimpleNamespace(blocks=blocks))


def test_the_vision_mlp_padding_is_checked_and_put_back_where_the_layout_is_not_gate_then_up():
    from reward_server.engines.vllm.vision_mlp import align_vision_mlps

    done = align_vision_mlps(_model(interleaved=False))
    assert done["padded"] == 2 and done["widths"] == [(100, 128)] and done["checked"] < 1e-5

    model = _model(interleaved=True)
    before = [(b.mlp.gate_up_proj.weight.clone(), b.mlp.down_proj.weight.clone()) for b in model.visual.blocks]
    done = align_vision_mlps(model)
    assert done["padded"] == 0 and "differs from its unpadded self" in done["skipped"]
    for block, (gate_up, down) in zip(model.visual.blocks, before, strict=True):
        assert torch.equal(block.mlp.gate_up_proj.weight, gate_up) and torch.equal(block.mlp.down_proj.weight, down)


def test_the_workers_probe_names_the_runner_and_what_it_lacks():
    from reward_server.engines.vllm.worker import RewardWorkerExtension

    class RunnerV2:  # V2's runner has neither of V1's encoder methods the patches hook
        def execute_model(self, scheduler_output): ...

        def sample_tokens(self, grammar): ...

        def get_model(self):
            return types.SimpleNamespace(visual=types.SimpleNamespace(blocks=[]))

    worker = RewardWorkerExtension()
    worker.model_runner = RunnerV2()
    worker.vllm_config = types.SimpleNamespace(use_v2_model_runner=True)
    probed = worker.reward_probe_patches()
    assert probed["runner"] == "V2" and probed["runner_class"].endswith("RunnerV2")
    assert probed["missing"] == [
        "_execute_mm_encoder",
        "_batch_mm_inputs_from_scheduler",
        "model.prepare_encoder_cudagraph_replay_buffers",
    ]
    states = PatchStates()
    states.worker = probed
    assert "names it lacks: _execute_mm_encoder, _batch_mm_inputs_from_scheduler" in states.table()


def test_gpus_get_model_runner_v1_unless_the_user_names_a_runner():
    """On GPUs the engine asks vLLM for V1 (faster here, and what every patch was measured on) and
    says so; a runner the user names is kept, and CPUs are left to vLLM."""
    from reward_server.engines.vllm.patches import V2_ENV, prefer_v1_on_gpus

    environ: dict[str, str] = {}
    said = prefer_v1_on_gpus(environ, on_gpu=True)
    assert environ == {V2_ENV: "0"} and "VLLM_USE_V2_MODEL_RUNNER=1" in said
    for named in ("1", "0"):
        environ = {V2_ENV: named}
        assert prefer_v1_on_gpus(environ, on_gpu=True) is None and environ == {V2_ENV: named}
    environ = {}
    assert prefer_v1_on_gpus(environ, on_gpu=False) is None and environ == {}


def test_the_cpu_worker_moves_into_the_engine_core_unless_the_user_decided():
    from reward_server.engines.vllm.worker_in_core import ENV, worker_in_core

    env: dict[str, str] = {}
    assert worker_in_core(None, on_gpu=False, environ=env)[0] and env == {ENV: "0"}  # CPU default
    for wanted in (None, True, False):  # GPUs: vLLM's own choice, the environment untouched
        env = {}
        assert not worker_in_core(wanted, on_gpu=True, environ=env)[0] and env == {}
    env = {}
    inside, why = worker_in_core(False, on_gpu=False, environ=env)
    assert not inside and env == {} and "worker_in_core=false" in why
    for value, inside in (("1", False), ("0", True)):  # a variable the user set wins over the option
        env = {ENV: value}
        assert worker_in_core(not inside, on_gpu=False, environ=env) == (
            inside,
            f"{ENV}={value} set before the server started",
        )
        assert env == {ENV: value}
