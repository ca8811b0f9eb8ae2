"""The same server as Ray Serve replicas: `python -m reward_server serve-ray`.

    python -m reward_server serve-ray --num-replicas 2 --gpus-per-replica 1 [--address auto] \\
        --backend qwen2_5_vl_vllm --model-path /models/Qwen2.5-VL-7B-Instruct --port 18080

Each replica builds its own engine and serves the identical FastAPI app (routes, schemas,
health semantics), so clients need only the endpoint. Ray Serve's health check calls the
replica's `check_health`, which fails once the engine has failed; Serve then replaces the replica.
With `--address auto` it joins a running Ray cluster (RLinf's own), else it starts a local one.

Several nodes: by default Serve runs an HTTP proxy on every node that holds a replica, on the
same port, and a proxy sends each request to a replica on its own node while that replica takes
more (`--max-ongoing-requests`), else to another node's. Env workers should therefore send to
their own node's proxy: the body never crosses the network unless the local replica is full.
`--resources-per-replica` (custom resources each node advertises) and `--max-replicas-per-node`
place the replicas; every answer names its replica in the `x-reward-replica` header
(`<replica id>@<node id>`), for checking where requests went.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field

from reward_server.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayServeOptions:
    num_replicas: int = 1
    gpus_per_replica: float = 1.0
    cpus_per_replica: float = 1.0
    address: str | None = None
    resources_per_replica: dict[str, float] = field(default_factory=dict)  # custom Ray resources
    max_replicas_per_node: int | None = None
    max_ongoing_requests: int | None = None  # default: max(64, --max-queue)
    proxy_location: str = "EveryNode"  # EveryNode, HeadOnly or Disabled (Serve's ProxyLocation)


REPLICA_HEADER = b"x-reward-replica"


class ReplicaHeader:
    """Plain ASGI middleware: every HTTP answer names the replica that gave it."""

    def __init__(self, app, name: str):
        self.app = app
        self.header = (REPLICA_HEADER, name.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def _replica_class():
    from ray import serve

    @serve.deployment(name="reward_server", health_check_period_s=5, health_check_timeout_s=30)
    @serve.ingress()
    class RewardReplica:
        def __init__(self, settings_json: str):
            import ray

            from reward_server.bootstrap import build_service
            from reward_server.http.app import build_app

            settings = ServerSettings.model_validate_json(settings_json)
            logging.basicConfig(level=settings.log_level.upper())
            self.service = build_service(settings, owns_process=True)
            name = f"{serve.get_replica_context().replica_tag}@{ray.get_runtime_context().get_node_id()}"
            self._asgi_app = ReplicaHeader(build_app(self.service), name)

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
    serve.start(proxy_location=options.proxy_location, http_options={"host": settings.host, "port": settings.port})
    actor_options: dict = {"num_gpus": options.gpus_per_replica, "num_cpus": options.cpus_per_replica}
    if options.resources_per_replica:
        actor_options["resources"] = dict(options.resources_per_replica)
    extra = {"max_replicas_per_node": options.max_replicas_per_node} if options.max_replicas_per_node else {}
    deployment = _replica_class().options(
        num_replicas=options.num_replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=options.max_ongoing_requests or max(64, settings.max_queue),
        **extra,
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
