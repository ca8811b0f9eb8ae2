"""The same server as Ray Serve replicas: `python -m reward_server serve-ray`.

    python -m reward_server serve-ray --num-replicas 2 --gpus-per-replica 1 [--address auto] \\
        --backend qwen2_5_vl_vllm --model-path /models/Qwen2.5-VL-7B-Instruct --port 18080

Each replica builds its own engine and serves the identical FastAPI app (routes, schemas,
health semantics), so clients need only the endpoint. Ray Serve's health check calls the
replica's `check_health`, which fails once the engine has failed; Serve then replaces the replica.
With `--address auto` it joins a running Ray cluster (RLinf's own), else it starts a local one.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass

from reward_server.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayServeOptions:
    num_replicas: int = 1
    gpus_per_replica: float = 1.0
    cpus_per_replica: float = 1.0
    address: str | None = None


def _replica_class():
    from ray import serve

    @serve.deployment(name="reward_server", health_check_period_s=5, health_check_timeout_s=30)
    @serve.ingress()
    class RewardReplica:
        def __init__(self, settings_json: str):
            from reward_server.app import build_app
            from reward_server.bootstrap import build_service

            settings = ServerSettings.model_validate_json(settings_json)
            logging.basicConfig(level=settings.log_level.upper())
            self.service = build_service(settings)
            self._asgi_app = build_app(self.service)

        def __serve_build_asgi_app__(self):
            return self._asgi_app

        async def check_health(self) -> None:
            await self.service.check_health()
            if self.service.status == "failed":
                raise RuntimeError(f"engine failed: {self.service.detail}")

    return RewardReplica


def serve_replicas(settings: ServerSettings, options: RayServeOptions) -> int:
    """Start the replicas and serve until SIGTERM / SIGINT."""
    import ray
    from ray import serve

    ray.init(address=options.address, include_dashboard=False, log_to_driver=True)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    deployment = _replica_class().options(
        num_replicas=options.num_replicas,
        ray_actor_options={"num_gpus": options.gpus_per_replica, "num_cpus": options.cpus_per_replica},
        max_ongoing_requests=max(64, settings.max_queue),
    )
    serve.run(deployment.bind(settings.model_dump_json()), name="reward_server", route_prefix="/")
    logger.info("serving %d replicas on http://%s:%d", options.num_replicas, settings.host, settings.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0
