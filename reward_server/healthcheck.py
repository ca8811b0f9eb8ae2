"""`python -m reward_server.healthcheck`: exit 0 when the reward server answers `/health` ok.

For a container's HEALTHCHECK or an exec probe: no curl needed, only the standard library and
the server's own flag parser. The address comes from the running server's flags (found among
this machine's processes, preset files resolved from the server's working directory), so a
server started with `--port 18188`, `--config FILE` or `--host 127.0.0.1` is probed where it
listens. `--url URL` probes a given address instead. Exit 1 (unhealthy) says why on stdout,
which Docker keeps in `docker inspect`'s health log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


def server_processes(proc: Path = Path("/proc")) -> list[tuple[int, list[str], Path]]:
    """(pid, flags, working directory) of every `python -m reward_server` process, oldest pid
    first (a Ray Serve launcher, `serve-ray`, serves elsewhere and is skipped)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = (entry / "cwd").resolve()
        except OSError:  # gone, or not ours to read
            continue
        for i in range(len(argv) - 1):
            if argv[i] == "-m" and argv[i + 1] == "reward_server":
                flags = [a for a in argv[i + 2 :] if a]
                if flags[:1] != ["serve-ray"]:
                    found.append((int(entry.name), flags, cwd))
                break
    return sorted(found)


def health_url(flags: list[str], cwd: Path) -> str:
    from reward_server.cli import parse_settings

    here = Path.cwd()
    os.chdir(cwd)  # a relative --config is the server's, relative to where it started
    try:
        settings = parse_settings(flags)
    finally:
        os.chdir(here)
    host = _ANY_ADDRESS.get(settings.host, settings.host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}/health"


def probe(url: str, timeout_s: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(4096).decode(errors="replace")
            status = response.status
    except urllib.error.HTTPError as exc:  # 503 loading / draining / failed
        return False, f"{url}: {exc.code} {exc.read(4096).decode(errors='replace')}"
    except (OSError, ValueError) as exc:
        return False, f"{url}: {exc}"
    try:
        ok = status == 200 and json.loads(body).get("status") == "ok"
    except (ValueError, AttributeError):
        ok = False
    return ok, f"{url}: {status} {body}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reward_server.healthcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="probe this /health URL instead of the local server's")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    url = args.url
    if url is None:
        servers = server_processes()
        if not servers:
            print("no `python -m reward_server` process is running here")
            return 1
        _, flags, cwd = servers[0]
        try:
            url = health_url(flags, cwd)
        except SystemExit:  # the server's flags do not parse: it cannot be serving either
            print(f"cannot read the server's flags: {flags}")
            return 1
    ok, detail = probe(url, args.timeout)
    print(detail[:1000])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
