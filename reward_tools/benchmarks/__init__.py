"""Benchmarks of single questions (one part of the server, the client or the rollout, measured side
by side), each `python -m reward_tools.benchmarks.NAME --help`. The benchmarks users run against a
whole server are reward_tools.bench (the hook's traffic), bench_raw, bench_curves, bench_clients and
bench_chat."""
