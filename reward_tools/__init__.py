"""Tools around the reward server: the CPU demo, benchmarks, the judge evaluation, the parse CLI,
and the helper that runs a server as a child process. They import the serving core
(`reward_server`); the core never imports them."""
