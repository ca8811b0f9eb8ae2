"""The server's own routes for those who run it: /health, /metrics, /stats and the profiler's switches."""
