"""The chat route's sampling defaults from the checkpoint, as `vllm serve` takes them.

`vllm serve` (its default `--generation-config auto`) answers a chat request that leaves a
sampling field unset with the value in the checkpoint's `generation_config.json` (else the
generation settings of its `config.json`), and only then with OpenAI's neutral value. The fields
it takes are these eight, `max_new_tokens` becoming the default `max_tokens`; a field the file
does not set (or sets to null) keeps the neutral value. Released instruction checkpoints set
some of them (a low temperature, top_k, a repetition penalty), so the same request gets a
different answer here and there unless the server reads them too.

The vLLM engine asks vLLM itself (its model config's `get_diff_sampling_param`, which also
honours `--engine-option generation_config=vllm` and `override_generation_config`); the other
engines read the checkpoint here with transformers' `GenerationConfig`, the reader vLLM uses.

Checked at start, one rule for every engine (check_checkpoint, and check_overrides on the engine's
own overrides, before the engine loads; then checked_defaults on what it will apply): each default
must be a value a chat request may send for that field (reward_protocol.chat's bounds, which are
vLLM's). One that is not (a temperature of -1, a top_p of 7, a string) refuses the start, naming
the file, the field and what is allowed: served, vLLM answered 500 naming no field on every chat
request that left the field unset, and transformers sampled greedily without a word. A
generation_config.json that cannot be read as JSON (empty, a syntax error) is a warning naming the
file; its settings are then not applied (config.json's generation settings are, else the neutral
values, as `vllm serve` does). JSON that is not an object is refused (vLLM cannot start on it)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from reward_protocol.chat import ChatCompletionRequest

logger = logging.getLogger(__name__)

# the generation-config fields vLLM applies to requests that leave them unset
SAMPLING_FIELDS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)


GENERATION_CONFIG = "generation_config.json"


class InvalidGenerationConfig(ValueError):
    """A checkpoint's generation config sets a sampling default no request may send; the
    message names the source, the field, its value and what is allowed."""


def _request_field(name: str) -> str:
    return "max_tokens" if name == "max_new_tokens" else name


def allowed(field: str) -> str:
    """What a chat request may send for `field`, in words ("a number in [0, 2]")."""
    info = ChatCompletionRequest.model_fields[field]
    kind = "an integer" if "int" in str(info.annotation) else "a number"
    low = high = None
    for bound in info.metadata:
        if getattr(bound, "ge", None) is not None:
            low = f"[{bound.ge:g}"
        elif getattr(bound, "gt", None) is not None:
            low = f"({bound.gt:g}"
        elif getattr(bound, "le", None) is not None:
            high = f"{bound.le:g}]"
        elif getattr(bound, "lt", None) is not None:
            high = f"{bound.lt:g})"
    if low and high:
        return f"{kind} in {low}, {high}"
    if low:
        return f"{kind} {'>=' if low[0] == '[' else '>'} {low[1:]}"
    return kind


def checked_defaults(defaults: dict[str, Any], source: str) -> dict[str, Any]:
    """The defaults as they are, if each is a value a chat request may send for its field (JSON
    numbers only: no strings, no booleans); else InvalidGenerationConfig naming every bad field."""
    problems = []
    for name, value in defaults.items():
        field = _request_field(name)
        if field not in ChatCompletionRequest.model_fields:
            continue
        info = ChatCompletionRequest.model_fields[field]
        try:
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError
            TypeAdapter(Annotated[(info.annotation, *info.metadata)]).validate_python(value, strict=True)
        except (ValidationError, ValueError):
            problems.append(
                f"{name} {json.dumps(value) if _jsonable(value) else repr(value)} (allowed: {allowed(field)})"
            )
    if problems:
        raise InvalidGenerationConfig(
            f"{source} sets {'; '.join(problems)}: chat requests that leave these unset could not be "
            "served; fix or remove them (null or absent keeps the neutral value)"
        )
    return defaults


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def read_generation_config(model_path: str) -> dict[str, Any] | None:
    """The checkpoint's generation_config.json as a JSON object; None when there is none, or
    (with a warning naming the file) when it cannot be read as JSON: empty, not UTF-8, a syntax
    error, unreadable. Both engines' reader (transformers') then falls back to config.json. A
    file of JSON that is not an object (a list) is refused: transformers' reader raises a
    TypeError on it, and vLLM cannot start."""
    if not model_path or not Path(model_path).is_dir():
        return None
    path = Path(model_path) / GENERATION_CONFIG
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON (an empty file)
        logger.warning(
            "%s cannot be read as JSON (%s: %s): its sampling defaults are not applied (chat requests that "
            "leave a field unset get config.json's generation settings, else the neutral values, as vllm serve)",
            path,
            type(exc).__name__,
            str(exc)[:200],
        )
        return None
    if not isinstance(data, dict):
        raise InvalidGenerationConfig(
            f"{path} holds a JSON {type(data).__name__}, not an object of generation settings; fix or remove it"
        )
    return data


def check_checkpoint(model_path: str) -> None:
    """Before the engine loads: the checkpoint's generation_config.json readable (else a warning
    naming it) and every sampling field it sets within what a request may send (else refused)."""
    check_overrides(read_generation_config(model_path), str(Path(model_path) / GENERATION_CONFIG))


def check_overrides(overrides: Any, source: str) -> None:
    """Before the engine loads: the sampling fields a JSON object of generation settings sets (the
    checkpoint's file, or vLLM's `override_generation_config` option) within what a request may
    send, else refused, naming `source`; known before a model of minutes loads. What the engine
    applies is checked again once loaded (its `sampling_defaults`). Anything that is not an object
    (None: no settings) is left alone: the engine refuses what it cannot take."""
    if isinstance(overrides, dict):
        present = {name: overrides[name] for name in SAMPLING_FIELDS if overrides.get(name) is not None}
        checked_defaults(present, source)


def from_generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """The defaults a generation config's fields give: the sampling ones that are set, with
    `max_new_tokens` named `max_tokens` (the OpenAI field it defaults)."""
    out = {name: config[name] for name in SAMPLING_FIELDS if config.get(name) is not None}
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


def checkpoint_sampling_defaults(model_path: str) -> dict[str, Any]:
    """The defaults of the checkpoint in the directory `model_path`; {} when it is not a local
    directory (the fake engine's placeholder names) or sets none."""
    if not model_path or not Path(model_path).is_dir():
        return {}
    from transformers import AutoConfig, GenerationConfig

    try:
        read_generation_config(model_path)  # refused if not an object (transformers' TypeError)
        config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: the generation settings of config.json, as vLLM
        try:
            config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_path))
        except (OSError, ValueError):
            return {}
    return checked_defaults(from_generation_config(config.to_diff_dict()), f"the generation config of {model_path}")
