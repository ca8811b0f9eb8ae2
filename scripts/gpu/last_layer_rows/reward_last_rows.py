"""A GPU experiment, not part of the server: the last decoder layer's o_proj, post-attention norm
and MLP computed only for the rows vLLM samples from (each request's last scheduled token).

Why: in a prefill-only batch (the hook path, one score per episode) vLLM runs every layer for every
prompt token, then keeps one row per request for the logits. The last layer's attention must run
for every token (its keys and values go to the KV cache, and the kept rows attend to them), but
what comes after it feeds nothing but the logits. For Qwen2.5-VL-7B that is o_proj and the MLP,
~3.3% of the language model's linear FLOPs (216M of 28 x 233M weights a token): ~35 ms of the
1.45-1.53 s the GPU spends on 64 episodes, by count.

How, on vLLM 0.26's V1 model runner (read from its source; measured by last_layer_rows.sh only):
- a vLLM general plugin (its entry point in the dist-info beside this file, found because the
  experiment's tree is on PYTHONPATH), loaded in each worker before the model is built, so the
  change is in the graph torch.compile traces;
- the last Qwen2 layer's o_proj returns its input, and the layer ends in one opaque custom op
  (`vllm.reward_last_rows`) that runs o_proj, the norm and the MLP: on the sampled rows when the
  runner said which (GPUModelRunner._prepare_inputs' logits indices, this step's token count,
  no prompt logprobs, no speculative decoding), on every row otherwise (a CUDA graph capture, a
  dummy run, a decode step where every row is sampled);
- the rows it skips hold zeros: the runner reads only the sampled rows of the model's output.
"""

import logging
import types
from typing import ClassVar

import torch

logger = logging.getLogger("vllm.reward_last_rows")
_LAYERS: dict[str, torch.nn.Module] = {}


class _Step:
    rows: torch.Tensor | None = None  # the logits indices of the step being launched
    tokens = 0  # its scheduled tokens
    used = 0  # steps that computed fewer rows
    full: ClassVar[dict[str, int]] = {}  # steps that computed every row, by why


def _take_rows(tokens: int) -> torch.Tensor | None:
    rows, expected = _Step.rows, _Step.tokens
    _Step.rows = None  # one forward per step: never reused by a later (dummy) run
    why = None
    if rows is None:
        why = "no rows from the runner"
    elif expected != tokens:
        why = "tokens other than scheduled"
    elif rows.numel() >= tokens:
        why = "every row sampled"
    elif torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        why = "a CUDA graph capture"
    if why is not None:
        _Step.full[why] = _Step.full.get(why, 0) + 1
        n = sum(_Step.full.values())
        if n in (1, 10, 100, 1000):
            logger.warning("reward_last_rows: every row computed in %d steps: %s (last: %d tokens, %s scheduled)",
                           n, _Step.full, tokens, expected)
        return None
    return rows.long()  # the runner's indices are int32; index_copy_ takes int64


def _tail(attn_out: torch.Tensor, residual: torch.Tensor, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    layer = _LAYERS[key]
    rows = _take_rows(attn_out.shape[0])
    if rows is None:
        h, _ = layer.self_attn.o_proj.reward_forward(attn_out)
        h, r = layer.post_attention_layernorm(h, residual.clone())  # the norm may add in place
        return layer.mlp(h), r
    h, _ = layer.self_attn.o_proj.reward_forward(attn_out.index_select(0, rows))
    h, r = layer.post_attention_layernorm(h, residual.index_select(0, rows))
    h = layer.mlp(h)
    out_h = residual.new_zeros(residual.shape)
    out_r = residual.new_zeros(residual.shape)
    out_h.index_copy_(0, rows, h)
    out_r.index_copy_(0, rows, r)
    _Step.used += 1
    if _Step.used in (1, 10, 30, 100, 300, 1000):
        logger.warning(
            "reward_last_rows: step of %d tokens, last layer on %d rows (%d such steps)",
            attn_out.shape[0],
            rows.numel(),
            _Step.used,
        )
    return out_h, out_r


def _tail_fake(attn_out: torch.Tensor, residual: torch.Tensor, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(residual), torch.empty_like(residual)


def _last_layer_forward(self, positions, hidden_states, residual):
    hidden_states, residual = self.input_layernorm(hidden_states, residual)
    attn_out = self.self_attn(positions=positions, hidden_states=hidden_states)  # o_proj: its input
    return torch.ops.vllm.reward_last_rows(attn_out, residual, self.reward_key)


def _passthrough(self, x):
    return x, None


def register() -> None:
    from vllm.model_executor.models import qwen2
    from vllm.utils.torch_utils import direct_register_custom_op

    if getattr(qwen2.Qwen2Model, "reward_last_rows", False):
        return
    direct_register_custom_op("reward_last_rows", _tail, mutates_args=[], fake_impl=_tail_fake)

    init = qwen2.Qwen2Model.__init__

    def patched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        last = self.layers[self.end_layer - 1]
        if not all(hasattr(last, n) for n in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")):
            logger.warning("reward_last_rows: the last layer is a %s: unchanged", type(last).__name__)
            return
        o_proj = last.self_attn.o_proj
        o_proj.reward_forward = o_proj.forward
        o_proj.forward = types.MethodType(_passthrough, o_proj)
        # a stable key: it is a constant in the compiled graph, which vLLM caches on disk and a later
        # engine loads (an object id there named a layer of an earlier process: KeyError at start)
        last.reward_key = f"layer{self.end_layer - 1}"
        _LAYERS[last.reward_key] = last
        last.forward = types.MethodType(_last_layer_forward, last)
        _patch_runner()  # the model is built in the worker only: the runner is patched there
        logger.warning(
            "reward_last_rows: layer %d of %s ends in vllm.reward_last_rows", self.end_layer - 1, type(self).__name__
        )

    qwen2.Qwen2Model.__init__ = patched_init
    qwen2.Qwen2Model.reward_last_rows = True
    logger.warning("reward_last_rows: registered (an experiment: scripts/gpu/last_layer_rows.sh)")


def _patch_runner() -> None:
    from vllm.v1.worker import gpu_model_runner

    if getattr(gpu_model_runner.GPUModelRunner, "reward_last_rows", False):
        return
    prepare = gpu_model_runner.GPUModelRunner._prepare_inputs

    def patched_prepare(self, scheduler_output, *args, **kwargs):
        out = prepare(self, scheduler_output, *args, **kwargs)
        logits_indices, spec = out[0], out[1]
        plain = (
            spec is None
            and not getattr(self, "num_prompt_logprobs", None)
            and not getattr(self.input_batch, "num_prompt_logprobs", None)
        )
        _Step.rows = logits_indices if plain else None
        _Step.tokens = scheduler_output.total_num_scheduled_tokens
        return out

    gpu_model_runner.GPUModelRunner._prepare_inputs = patched_prepare
    gpu_model_runner.GPUModelRunner.reward_last_rows = True
