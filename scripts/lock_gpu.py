"""The GPU lock's two halves for scripts/lock_deps.sh, which cannot install vLLM for CUDA here.

python scripts/lock_gpu.py requirements PYPROJECT PIN...   what `install_deps.sh --with-primo`
    asks for on GPUs (the base, server, vllm and primo requirements), then the pins
python scripts/lock_gpu.py merge 3.11=REPORT 3.12=REPORT    pip's --report of each Python as one
    constraints list: a package at one version everywhere is one line; else a line per Python
    with a python_version marker
python scripts/lock_gpu.py pins LOCK PYTHON REQ...   each requirement at the lock's version for that
    Python where the lock names the package (scripts/gpu/prepare_vllm_carry.sh: the carry gets what
    a locked install gets), else as given
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import tomllib

EXTRAS = ("server", "vllm", "primo")
SELF = "vlm-reward-service"


def requirements(pyproject: Path, pins: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *(req for name in EXTRAS for req in extras[name])]
    return [req for req in wanted if not req.startswith(SELF)] + pins


def installed(report: Path) -> dict[str, str]:
    """name -> version of what pip's --report would install."""
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}


def merge(reports: dict[str, dict[str, str]]) -> list[str]:
    """One constraints list from each Python's resolution ({"3.11": {name: version}, ...})."""
    lines = []
    for name in sorted({n for pins in reports.values() for n in pins}, key=str.lower):
        versions = {py: pins.get(name) for py, pins in reports.items()}
        if len(set(versions.values())) == 1:
            lines.append(f"{name}=={versions[next(iter(versions))]}")
            continue
        lines += [f'{name}=={v}; python_version == "{py}"' for py, v in versions.items() if v is not None]
    return lines


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: Path, python: str, reqs: list[str]) -> list[str]:
    """Each of `reqs` pinned to `lock`'s version for `python` where the lock names it."""
    locked: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        found = re.match(r'^([A-Za-z0-9_.-]+)==(\S+?)(?:; python_version == "([\d.]+)")?$', line.strip())
        if found and found.group(3) in (None, python):
            locked[_key(found.group(1))] = f"{found.group(1)}=={found.group(2)}"
    return [locked.get(_key(re.split(r"[<>=!~; \[]", req, maxsplit=1)[0]), req) for req in reqs]


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "requirements":
        print("\n".join(requirements(Path(argv[1]), argv[2:])))
        return 0
    if len(argv) >= 2 and argv[0] == "merge" and all("=" in a for a in argv[1:]):
        reports = {py: installed(Path(path)) for py, path in (a.split("=", 1) for a in argv[1:])}
        print("\n".join(merge(reports)))
        return 0
    if len(argv) >= 3 and argv[0] == "pins":
        print("\n".join(pins(Path(argv[1]), argv[2], argv[3:])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
