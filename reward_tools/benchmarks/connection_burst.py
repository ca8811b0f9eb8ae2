#!/usr/bin/env python3
"""A burst of simultaneous requests over --max-connections against a local server (fake engine).

    python -m reward_tools.benchmarks.connection_burst [--requests 3000] [--max-connections 2048] [--hold-ms 5000]

Opens every connection first, then sends one POST /score on each (the fake engine holds each
served request --hold-ms, so the burst meets a full server), asks GET /health during the burst,
and prints the answers by status and the server's WARNING lines about refusals. Bounded: one
burst, 127.0.0.1 only, the server stops by itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import tempfile
import time
from pathlib import Path

from reward_tools.launch import ServerProcess

logger = logging.getLogger("bench_connection_burst")


def _status(sock: socket.socket) -> int | str:
    try:
        data = sock.recv(65536)
    except OSError as exc:
        return type(exc).__name__
    return int(data.split()[1]) if data else "closed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--max-connections", type=int, default=2048)
    parser.add_argument("--hold-ms", type=int, default=5000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    flags = ["--engine", "fake", "--decode-workers", "1", "--max-queue", str(4 * args.requests)]
    flags += ["--max-connections", str(args.max_connections), "--engine-option", f"delay_ms={args.hold_ms}"]
    body = json.dumps({"task_text": "t", "frames": {"shape": [2, 8, 8, 3], "data_b64": "A" * 512}}).encode()
    request = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with ServerProcess(flags, log_path=log) as server:
            server.wait_ready(120)
            socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(args.requests)]
            for sock in socks:
                sock.sendall(request)
            time.sleep(1)
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as probe:
                probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                health = _status(probe)
            codes: dict[str, int] = {}
            for sock in socks:
                sock.settimeout(60)
                key = str(_status(sock))
                codes[key] = codes.get(key, 0) + 1
                sock.close()
        warnings = [line for line in log.read_text().splitlines() if "WARNING" in line and "connections" in line]
    result = {
        "requests": args.requests,
        "max_connections": args.max_connections,
        "answers": dict(sorted(codes.items())),
        "health_during_burst": health,
        "refusal_warning_lines": len(warnings),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
