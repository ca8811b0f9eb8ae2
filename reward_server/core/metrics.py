"""Prometheus metrics of one server (own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


def _gauges(registry: CollectorRegistry, *named: tuple[str, str]) -> dict[str, Gauge]:
    """Gauges `reward_<key>` by key, for a dict of values that /stats reports under the same keys."""
    return {key: Gauge(f"reward_{key}", help_text, registry=registry) for key, help_text in named}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "reward_requests", "HTTP requests by route and status code", ["route", "code"], registry=r
        )
        self.episodes = Counter("reward_episodes", "Episodes scored, by parse status", ["status"], registry=r)
        self.parse_failures = Counter("reward_parse_failures", "Answers that gave no score", ["status"], registry=r)
        self.curve_points = Counter(
            "reward_curve_points", "Points of the progress curves scored (progress_points > 1)", registry=r
        )
        self.latency = Histogram(
            "reward_episode_latency_seconds", "Time per episode, end to end", buckets=LATENCY_BUCKETS, registry=r
        )
        self.engine_latency = Histogram(
            "reward_engine_latency_seconds", "Engine time per episode", buckets=LATENCY_BUCKETS, registry=r
        )
        self.episodes_in_progress = Gauge(
            "reward_episodes_in_progress", "Episodes admitted and not yet answered (--max-queue)", registry=r
        )
        self.chat_requests = Counter(
            "reward_chat_requests",
            "Chat completion choices answered (/v1), by finish reason",
            ["finish_reason"],
            registry=r,
        )
        self.chat_latency = Histogram(
            "reward_chat_latency_seconds", "Time per chat completion, end to end", buckets=LATENCY_BUCKETS, registry=r
        )
        self.chat_in_progress = Gauge(
            "reward_chat_in_progress", "Chat requests admitted and not yet answered (--max-queue)", registry=r
        )
        self.bytes_in_progress = Gauge(
            "reward_body_bytes_in_progress", "Request body bytes admitted (--max-inflight-mb)", registry=r
        )
        self.engine_running = Gauge("reward_engine_running", "Requests inside the engine", registry=r)
        self.decode_workers_replaced = Gauge(
            "reward_decode_workers_replaced", "Decode workers killed (budget) or found dead, and replaced", registry=r
        )
        self.unusable_outputs = Gauge(
            "reward_engine_unusable_outputs",
            "Requests the engine ended without an answer (abort: its own, not the server's; unfinished; "
            "empty), answered as retryable errors, never parsed",
            ["reason"],
            registry=r,
        )
        self.engine_held = _gauges(
            r,
            ("mm_cache_bytes_capacity", "vLLM's multimodal processor cache: size, bytes (--mm-processor-cache-gb)"),
            ("mm_cache_bytes_used", "vLLM's multimodal processor cache: bytes it holds now"),
            ("mm_cache_items", "vLLM's multimodal processor cache: entries it holds now"),
        )
        self.decoded_mb = _gauges(
            r,
            ("decoded_mb_in_use", "Decoded frames held by episodes in progress, MB (--max-decoded-mb)"),
            ("decoded_mb_budget", "The decoded-memory budget, MB (--max-decoded-mb)"),
            ("decoded_mb_peak", "The most decoded frames held at once since the start, MB"),
        )

    def set_engine(self, unusable: dict[str, int], held: dict[str, float | None]) -> None:
        """The engine's own counters and held memory, as they stand."""
        for reason, count in unusable.items():
            self.unusable_outputs.labels(reason).set(count)
        for key, value in held.items():
            if key in self.engine_held and value is not None:
                self.engine_held[key].set(value)

    def set_decoded(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.decoded_mb[key].set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
