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
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

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
        config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: the generation settings of config.json, as vLLM
        try:
            config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_path))
        except (OSError, ValueError):
            return {}
    return from_generation_config(config.to_diff_dict())
