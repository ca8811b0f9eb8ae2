"""The same server as Ray Serve replicas: `python -m reward_server serve-ray`.

    python -m reward_server serve-ray --num-replicas 2 --gpus-per-replica 1 [--address auto] \\
        --backend qwen2_5_vl_vllm --model-path /models/Qwen2.5-VL-7B-Instruct --port 18080

Each replica builds its own engine and serves the identical FastAPI app (routes, schemas,
health semantics), so clients need only the endpoint. Ray Serve's health check calls the
replica's `check_health`, which fails once the engine has failed; Serve then replaces the replica.
With `--address auto` it joins a running Ray cluster (RLinf's own), else it starts a local one.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from reward_server.settings import ServerSettings

logger = logging.getLogger(__name__)


def _replica_class():
    from ray import serve

    @serve.deployment(name="reward_server", health_check_period_s=5, health_check_timeout_s=30)
    @serve.ingress()
    class RewardReplica:
        def __init__(self, settings_json: str):
            from reward_server.app import build_app
            from reward_server.cli import build_service

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


def main(argv: list[str]) -> int:
    from reward_server.cli import parse_settings

    parser = argparse.ArgumentParser(prog="python -m reward_server serve-ray", add_help=False)
    parser.add_argument("--num-replicas", type=int, default=1)
    parser.add_argument("--gpus-per-replica", type=float, default=1.0)
    parser.add_argument("--cpus-per-replica", type=float, default=1.0)
    parser.add_argument("--address", default=None, help="Ray cluster address ('auto': the running cluster)")
    ours, rest = parser.parse_known_args(argv)
    settings = parse_settings(rest)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import ray
    from ray import serve

    ray.init(address=ours.address, include_dashboard=False, log_to_driver=True)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    deployment = _replica_class().options(
        num_replicas=ours.num_replicas,
        ray_actor_options={"num_gpus": ours.gpus_per_replica, "num_cpus": ours.cpus_per_replica},
        max_ongoing_requests=max(64, settings.max_queue),
    )
    serve.run(deployment.bind(settings.model_dump_json()), name="reward_server", route_prefix="/")
    logger.info("serving %d replicas on http://%s:%d", ours.num_replicas, settings.host, settings.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0
