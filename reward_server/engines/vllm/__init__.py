"""The vLLM adapter: the engine (`engine`), its options (`options`) and the patches it applies to
vLLM's internals, each declared, probed at start and, where it changes numbers, checked before use
(`patches`, `checks`). Nothing outside this package imports vLLM; `reward_server.engines` loads it lazily."""
