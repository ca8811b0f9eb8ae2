"""Every change this adapter makes to vLLM, declared once: what it changes and why, where it was
measured, the internal vLLM names it needs, whether it changes the numbers the model computes, and
its typed `--engine-option`s (`PatchOptions`).

At start the engine probes each patch's names in the installed vLLM (in the server's process, or in
vLLM's workers through the worker extension: engines/vllm/worker.py) and gives each patch a state:

- `applied`: it runs;
- `dormant`: it is asked for (or on by default) but does not run here: its probe failed, vLLM does
  the same itself (`retired_from`), or the model runner lacks what it hooks (Model Runner V2);
- `off`: not asked for (off by default on this device, or `--engine-option NAME=false`).

A patch that changes the numbers (`numbers=True`) runs only once its check passed: the same input
both ways, within the stated tolerance (engines/vllm/checks.py, and the vision MLP's own check in
the worker); otherwise it is turned off with a warning. The server logs the table once, at start,
and `/stats` carries it (`patches`). docs/operations.md's table of patches is checked against
`PATCHES` by tests/fast/test_vllm_patches.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

Runner = Literal["V1", "V2"]
State = Literal["applied", "dormant", "off"]
# vLLM's switch between its model runners (vLLM 0.32+: V2 by default on GPUs with Triton)
V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"


@dataclass(frozen=True)
class Patch:
    name: str
    changes: str  # what it changes and why, one line
    measured_on: tuple[str, ...]  # vLLM versions it was measured on (GPU unless said)
    runners: tuple[Runner, ...]  # the model runners it was measured on
    needs: tuple[str, ...]  # the internal vLLM names it relies on (probed at start)
    numbers: bool = False  # whether it changes numbers the model computes
    check: str = ""  # for those: how it is checked before it runs, and within what tolerance
    retired_from: str | None = None  # the vLLM version from which vLLM does this itself
    options: tuple[str, ...] = ()  # its PatchOptions fields (none: always on where it applies)
    on_v2: str = ""  # what it does on Model Runner V2, where that differs (read from vLLM 0.32's source)


PATCHES: tuple[Patch, ...] = (
    Patch(
        "input_threads",
        "vLLM's input processing (the HF processor) in a pool of threads, not on the event loop, one episode "
        "after another",
        ("0.24", "0.26", "0.32 (CPU)"),
        ("V1", "V2"),
        ("renderer.render_cmpl",),
        options=("input_threads",),
    ),
    Patch(
        "cache_hits",
        "a request whose items are all processor-cache hits runs no HF processor on a dummy text "
        "(a 16-point curve's inputs 44.8 -> 41.4 ms)",
        ("0.24", "0.26"),
        ("V1", "V2"),
        ("BaseMultiModalProcessor._apply_hf_processor_mm_only",),
        retired_from="0.32",
        options=("cache_hits",),
    ),
    Patch(
        "curve_clip_ids",
        "per-request item ids (multi_modal_uuids) instead of pixel hashes: a curve's clips processed once",
        ("0.24", "0.26", "0.32 (CPU)"),
        ("V1", "V2"),
        ("multi_modal_uuids", "renderer.mm_processor_cache._cache"),
        options=("curve_clip_ids", "curve_start"),
    ),
    Patch(
        "pixel_dtype",
        "pixels cast to the model's 16-bit dtype before they leave the server (half the copies; no speed "
        "change measured, off by default)",
        ("0.24", "0.26"),
        ("V1", "V2"),
        ("mm_kwargs items' .data (the processed input's layout)",),
        numbers=True,
        check="first token's top-5 log-probabilities of one probe episode, cast and not cast, within 2e-3",
        options=("pixel_dtype",),
    ),
    Patch(
        "encoder_batching",
        "one vision-encoder call per modality and step (PRIMO-R1's prefill 8.2 -> 4.2 s)",
        ("0.24", "0.26"),
        ("V1",),
        ("GPUModelRunner._batch_mm_inputs_from_scheduler",),
        options=("encoder_batching",),
        on_v2="dormant by probe: V2's EncoderRunner.execute_mm_encoder sorts a step's items by modality itself",
    ),
    Patch(
        "vision_mlp",
        "the vision MLP padded with zeros to a width of a multiple of 64 (the hook path 2.13 -> 1.97 s)",
        ("0.24",),
        ("V1",),
        ("model.visual.blocks[].mlp.gate_up_proj / down_proj", "UnquantizedLinearMethod"),
        numbers=True,
        check="each padded MLP against its unpadded self on one random input, in the worker, within "
        "1e-2 of the output's largest value",
        options=("vision_mlp",),
    ),
    Patch(
        "pixel_norm",
        "pixels sent as uint8 and normalized in the vision tower (input processing halved)",
        ("0.24", "0.26"),
        ("V1", "V2"),
        ("model.visual.forward", "model.prepare_encoder_cudagraph_replay_buffers"),
        numbers=True,
        check="the processor's float32 patches bit for bit (CPU), then the first token's top-5 "
        "log-probabilities of one probe episode both ways, within 2e-3",
        retired_from="0.32",
        options=("pixel_norm",),
    ),
    Patch(
        "step_timing",
        "each worker step timed into a file, with the vision encoder's share (profiles only)",
        ("0.24", "0.26", "0.32 (CPU)"),
        ("V1",),
        ("GPUModelRunner.execute_model", "GPUModelRunner.sample_tokens", "GPUModelRunner._execute_mm_encoder"),
        options=("step_timing",),
        on_v2="steps timed; encoder_ms and encoder_calls null (no _execute_mm_encoder on V2), never zero",
    ),
    Patch(
        "heap",
        "the workers' heaps frozen once warm (the cycle collector skips the warm-up's objects)",
        ("0.24", "0.26", "0.32 (CPU)"),
        ("V1", "V2"),
        ("worker_extension_cls", "collective_rpc"),
        options=("heap",),
    ),
    Patch(
        "step_floor",
        "a floor under each decoding step, for tests that act on a running generation (never when serving)",
        ("0.24", "0.32 (CPU)"),
        ("V1",),
        ("vllm.v1.sample.logits_processor.LogitsProcessor", "additional_config"),
        options=("step_floor_ms",),
        on_v2="refused at start by name: V2 refuses V1 logits processors; set VLLM_USE_V2_MODEL_RUNNER=0",
    ),
    Patch(
        "torch_threads",
        "one torch thread in the server and the engine core on GPUs (the hook path 1.68 -> 1.65 s)",
        ("0.24", "0.26"),
        ("V1", "V2"),
        ("OMP_NUM_THREADS read by the engine core",),
        options=("torch_threads",),
    ),
    Patch(
        "step_log",
        "the engine's steps as its stat logger sees them: batch size, cache lookups, optionally a file",
        ("0.24", "0.26", "0.32 (CPU)"),
        ("V1", "V2"),
        ("StatLoggerBase.record", "SchedulerStats.num_running_reqs", "prefix_cache_stats"),
        options=("step_log",),
    ),
    Patch(
        "profiler",
        "vLLM's torch profiler in the engine core, switched by POST /start_profile and /stop_profile",
        ("0.24",),
        ("V1",),
        ("profiler_config",),
        options=("profile_dir",),
    ),
    Patch(
        "worker_in_core",
        "vLLM's CPU worker inside its engine core, as on one GPU (VLLM_ENABLE_V1_MULTIPROCESSING=0): one "
        "process and one vLLM import fewer (the tiny server ready in 21.1 s against 27.9 s; 22.4 against "
        "41.4 s two at once)",
        ("0.32 (CPU)",),
        ("V1",),
        ("VLLM_ENABLE_V1_MULTIPROCESSING, read by CpuPlatform.check_and_update_config",),
        options=("worker_in_core",),
    ),
    Patch(
        "gil_switch",
        "the interpreter's thread switch interval in the server and the engine core (an experiment)",
        ("0.24",),
        ("V1",),
        (),
        options=("gil_switch_ms",),
    ),
)
BY_NAME = {p.name: p for p in PATCHES}


def doc_table() -> str:
    """The table of patches docs/operations.md shows (tests/fast/test_vllm_patches.py keeps the two equal)."""
    lines = [
        "| patch | what it changes, and why | measured on | changes numbers | vLLM names it needs | options "
        "| Model Runner V2 |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in PATCHES:
        measured = f"vLLM {', '.join(p.measured_on)}; {'/'.join(p.runners)}"
        if p.retired_from:
            measured += f"; retired from {p.retired_from}"
        numbers = f"yes; checked: {p.check}" if p.numbers else "no"
        options = ", ".join(f"`{o}`" + _alias_note(o) for o in p.options) or "-"
        needs = ", ".join(f"`{n}`" for n in p.needs) or "-"
        lines.append(
            f"| `{p.name}` | {p.changes} | {measured} | {numbers} | {needs} | {options} | {p.on_v2 or 'not measured'} |"
        )
    return "\n".join(lines)


def _alias_note(field: str) -> str:
    choices = [str(c) for c in PatchOptions.model_fields[field].validation_alias.choices]  # type: ignore[union-attr]
    return "".join(f" (or `{c}`)" for c in choices if c != field)


# --- typed options -------------------------------------------------------------------------------

_BOOL = "true or false"


def _name(field: str, alias: str | None = None) -> Any:
    """A field read as its patch's name or its `--engine-option` string (kept as an alias)."""
    return AliasChoices(field, alias) if alias and alias != field else AliasChoices(field)


class PatchOptions(BaseModel):
    """The engine options of the patches, typed: each read from `--engine-option NAME=VALUE` under
    its patch's name or the option string it had before (`normalize_on_device` is `pixel_norm`).
    None: the patch's default for the device."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    encoder_batching: bool | None = Field(None, validation_alias=_name("encoder_batching"))
    vision_mlp: bool | None = Field(None, validation_alias=_name("vision_mlp", "vision_mlp_align"))
    pixel_norm: bool | None = Field(None, validation_alias=_name("pixel_norm", "normalize_on_device"))
    pixel_dtype: bool = Field(False, validation_alias=_name("pixel_dtype", "pixels_in_model_dtype"))
    cache_hits: bool = Field(True, validation_alias=_name("cache_hits", "skip_cached_hf_call"))
    heap: bool = Field(True, validation_alias=_name("heap", "freeze_engine_heap"))
    step_timing: str | None = Field(None, min_length=1, validation_alias=_name("step_timing"))
    step_log: str | None = Field(None, min_length=1, validation_alias=_name("step_log"))
    profile_dir: str | None = Field(None, validation_alias=_name("profile_dir"))
    torch_threads: int | None = Field(None, ge=1, validation_alias=_name("torch_threads"))
    input_threads: int | None = Field(None, ge=0, validation_alias=_name("input_threads", "preprocess_threads"))
    gil_switch_ms: float | None = Field(None, gt=0, validation_alias=_name("gil_switch_ms"))
    step_floor_ms: float | None = Field(None, ge=0, validation_alias=_name("step_floor_ms"))
    curve_start: Literal["handed", "prefilled"] = Field("handed", validation_alias=_name("curve_start"))
    curve_clip_ids: bool = Field(True, validation_alias=_name("curve_clip_ids"))
    worker_in_core: bool | None = Field(None, validation_alias=_name("worker_in_core"))


# what each option allows, for the error that refuses another value
_ALLOWED = {
    "encoder_batching": _BOOL,
    "vision_mlp": _BOOL,
    "pixel_norm": _BOOL,
    "pixel_dtype": _BOOL,
    "cache_hits": _BOOL,
    "heap": _BOOL,
    "curve_clip_ids": _BOOL,
    "worker_in_core": _BOOL,
    "step_timing": "a file path",
    "step_log": "a file path",
    "torch_threads": "a whole number of threads >= 1 is allowed",
    "input_threads": "a whole number of threads >= 0 is allowed (0: inputs processed on the event loop)",
    "gil_switch_ms": "a number of milliseconds > 0",
    "step_floor_ms": "a number of milliseconds >= 0",
    "curve_start": "handed or prefilled",
}


def option_names() -> set[str]:
    """Every key PatchOptions reads (patch names and the older option strings): the adapter's own,
    never handed to vLLM's engine arguments."""
    names: set[str] = set()
    for field in PatchOptions.model_fields.values():
        names.update(str(choice) for choice in field.validation_alias.choices)  # type: ignore[union-attr]
    return names


def parse_options(options: dict[str, Any]) -> PatchOptions:
    """The typed options in `--engine-option`s; ValueError naming the option, the value and what is
    allowed, or the two names that gave one option different values."""
    for name, field in PatchOptions.model_fields.items():
        given = {str(c): options[str(c)] for c in field.validation_alias.choices if str(c) in options}  # type: ignore[union-attr]
        if len(given) > 1 and len({str(v).strip().lower() for v in given.values()}) > 1:
            both = " and ".join(f"--engine-option {k}={v}" for k, v in given.items())
            raise ValueError(f"{both} set one option ({name}) to different values: give one")
    try:
        return PatchOptions.model_validate({k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = _field_of(str(error["loc"][0]))
        key = str(error["loc"][0])
        raise ValueError(f"--engine-option {key}={options.get(key)}: {_ALLOWED.get(field, error['msg'])}") from None


def _field_of(key: str) -> str:
    for name, field in PatchOptions.model_fields.items():
        if key in {str(c) for c in field.validation_alias.choices}:  # type: ignore[union-attr]
            return name
    return key


# --- states ----------------------------------------------------------------------------------------


@dataclass
class PatchRow:
    patch: str
    state: State
    reason: str

    def as_dict(self) -> dict[str, Any]:
        declared = BY_NAME[self.patch]
        return {
            "patch": self.patch,
            "state": self.state,
            "reason": self.reason,
            "measured_on": list(declared.measured_on),
            "runners": list(declared.runners),
            "changes_numbers": declared.numbers,
        }


class PatchStates:
    """Each declared patch's state in this engine, set as start learns it (every patch starts
    `off`, unexplained, until the engine decides)."""

    def __init__(self) -> None:
        self.rows = {p.name: PatchRow(p.name, "off", "not decided (the engine did not start)") for p in PATCHES}
        self.runner: Runner | None = None
        self.vllm_version: str | None = None
        self.worker: dict[str, Any] = {}  # the first worker's PatchProbe answer

    def set(self, name: str, state: State, reason: str) -> None:
        if name not in self.rows:
            raise KeyError(f"no patch {name!r} is declared (engines/vllm/patches.py)")
        self.rows[name] = PatchRow(name, state, reason)

    def state(self, name: str) -> State:
        return self.rows[name].state

    def measured_here(self, name: str) -> bool:
        """Whether the patch was measured on this vLLM's version (its major.minor) and runner."""
        declared = BY_NAME[name]
        release = ".".join((self.vllm_version or "").split(".")[:2])
        versions = {m.split()[0] for m in declared.measured_on}
        return release in versions and (self.runner is None or self.runner in declared.runners)

    def _reason(self, row: PatchRow) -> str:
        if row.state == "applied" and self.vllm_version and not self.measured_here(row.patch):
            return f"{row.reason} [outside its measured range: runs because its probe passed]"
        return row.reason

    def as_list(self) -> list[dict[str, Any]]:
        return [{**row.as_dict(), "reason": self._reason(row)} for row in self.rows.values()]

    def table(self) -> str:
        """The table the server logs once at start: patch, state, reason."""
        width = max(len(name) for name in self.rows)
        head = f"vLLM {self.vllm_version or '?'}, model runner {self.runner or '?'}: patches"
        lines = [head]
        if self.worker:
            missing = ", ".join(self.worker.get("missing") or []) or "none"
            lines.append(f"  worker: {self.worker.get('runner_class')}; names it lacks: {missing}")
        lines.append(f"  {'patch':<{width}}  {'state':<7}  reason")
        lines += [f"  {r.patch:<{width}}  {r.state:<7}  {self._reason(r)}" for r in self.rows.values()]
        return "\n".join(lines)


def runner_of(vllm_config: Any) -> Runner:
    """The model runner a vLLM config selects: V2 where vLLM says so (`use_v2_model_runner`, vLLM
    0.32+: the default on GPUs that have Triton), V1 where it says otherwise or has no V2."""
    return "V2" if bool(getattr(vllm_config, "use_v2_model_runner", False)) else "V1"


def explicit_runner(environ: dict[str, str]) -> Runner | None:
    """The runner `VLLM_USE_V2_MODEL_RUNNER` asks for, or None when it is unset (vLLM decides)."""
    value = environ.get(V2_ENV)
    if value is None or value.strip() == "":
        return None
    return "V1" if value.strip().lower() in ("0", "false", "no", "off") else "V2"


# Model Runner V1 on GPUs unless the user names a runner: one H200, vLLM 0.26.0, the 7B preset, 64
# episodes on the hook path, V1 1.58 s against V2 1.75 s (V2 has no encoder CUDA graphs), PRIMO-R1's
# first token 2.72 s against 5.10 s (docs/bench/h200_2026-12-02_issue57/README.md); and every patch
# here was measured on V1.
V1_ON_GPUS = (
    "model runner V1 (VLLM_USE_V2_MODEL_RUNNER=0), the faster one on GPUs here: one H200, vLLM 0.26, "
    "64 episodes 1.58 s against 1.75 s on V2; set VLLM_USE_V2_MODEL_RUNNER=1 for vLLM's V2"
)


def prefer_v1_on_gpus(environ: dict[str, str] | Any, on_gpu: bool) -> str | None:
    """Ask vLLM for its V1 model runner on GPUs where the user named none (the engine core inherits
    the environment); the log line saying so, or None where nothing was changed."""
    if not on_gpu or explicit_runner(dict(environ)) is not None:
        return None
    environ[V2_ENV] = "0"
    return V1_ON_GPUS


PROBE_METHOD = "reward_probe_patches"
# the internal names the worker patches hook, looked up on the worker's model runner and model
RUNNER_NAMES = ("execute_model", "sample_tokens", "get_model", "_execute_mm_encoder", "_batch_mm_inputs_from_scheduler")
MODEL_NAMES = ("visual", "visual.blocks", "prepare_encoder_cudagraph_replay_buffers")


def _has(obj: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


class PatchProbe:
    """vLLM's worker extension (engines/vllm/worker.py): what the worker patches find in this
    worker, called once at start whatever is switched on, for the table."""

    def reward_probe_patches(self) -> dict[str, Any]:
        runner = getattr(self, "model_runner", None)
        model = runner.get_model() if hasattr(runner, "get_model") else None
        kind = type(runner)
        config = getattr(self, "vllm_config", None) or getattr(runner, "vllm_config", None)
        return {
            "runner": runner_of(config),
            "runner_class": f"{kind.__module__}.{kind.__qualname__}",
            "missing": [n for n in RUNNER_NAMES if not _has(runner, n)]
            + [f"model.{n}" for n in MODEL_NAMES if not _has(model, n)],
        }


class NeedsV1(ValueError):
    """An option that works only on vLLM's V1 model runner, asked for where V2 runs."""


def refuse_on_v2(options: PatchOptions, runner: Runner | None) -> None:
    """Refuse, by name, the options that cannot work on Model Runner V2 (it refuses V1's logits
    processors: the engine would never start)."""
    if runner == "V2" and options.step_floor_ms:
        raise NeedsV1(
            f"--engine-option step_floor_ms={options.step_floor_ms:g} needs V1: its logits processor is "
            f"vLLM's V1 interface, which Model Runner V2 refuses; set {V2_ENV}=0"
        )
