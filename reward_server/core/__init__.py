"""The core every route goes through: lifecycle state, admission and the request's deadline behind
one entry (service, admission), the start-up warm-up (warmup) and the server's metrics."""
