from reward_server.cli import main

# vLLM starts its workers with spawn, which re-imports this module: keep the guard.
if __name__ == "__main__":
    raise SystemExit(main())
