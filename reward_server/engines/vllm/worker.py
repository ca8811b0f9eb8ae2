"""What this server adds to vLLM's workers, as vLLM's `worker_extension_cls` (one class, so every
addition is a mixin here). The engine calls each method once after vLLM started, through
`collective_rpc`, for the features switched on (VllmEngine.worker_methods):

- encoder batching by modality (vllm_encoder_batching), on GPUs by default;
- the vision MLP padded to an aligned width (vllm_vision_mlp), on GPUs by default;
- uint8 pixels normalized in the vision tower (vllm_pixel_norm), where vLLM does not do it itself;
- each step timed in the worker, for profiles (vllm_step_timing), when asked for;
- the worker's heap frozen once the server is warm (vllm_heap), called after the warm-up;
- the registry's probe of the names the worker patches hook (engines/vllm/patches.py), always.
"""

from __future__ import annotations

from reward_server.engines.vllm.encoder_batching import ModalityBatching
from reward_server.engines.vllm.heap import HeapFreeze
from reward_server.engines.vllm.patches import PatchProbe
from reward_server.engines.vllm.pixel_norm import PixelNormalization
from reward_server.engines.vllm.step_timing import StepTiming
from reward_server.engines.vllm.vision_mlp import VisionMlpAlignment


class RewardWorkerExtension(
    PatchProbe, ModalityBatching, VisionMlpAlignment, PixelNormalization, StepTiming, HeapFreeze
):
    """vLLM resolves this class by name in its workers and adds its methods to the worker."""


FQCN = f"{__name__}.RewardWorkerExtension"
