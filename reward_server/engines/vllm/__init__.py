"""The vLLM adapter: the engine (`engine`), its options (`options`) and the patches it applies to
vLLM's internals. Nothing outside this package imports vLLM; `reward_server.engines` loads it lazily."""
