"""Prometheus metrics of one server (own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "reward_requests", "HTTP requests by route and status code", ["route", "code"], registry=r
        )
        self.episodes = Counter("reward_episodes", "Episodes scored, by parse status", ["status"], registry=r)
        self.parse_failures = Counter("reward_parse_failures", "Answers that gave no score", ["status"], registry=r)
        self.batch_size = Histogram(
            "reward_engine_batch_size", "Requests per engine batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "reward_episode_latency_seconds", "Time per episode, end to end", buckets=LATENCY_BUCKETS, registry=r
        )
        self.engine_latency = Histogram(
            "reward_engine_latency_seconds", "Engine time per episode", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("reward_queue_depth", "Requests waiting for the engine", registry=r)
        self.in_flight = Gauge("reward_in_flight", "Requests inside the engine", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
