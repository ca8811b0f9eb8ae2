"""scripts/gpu/carry_imports.py: before a lease, what `vllm serve` imports beyond the engine (which
ran on the lent machines) and no carried wheel provides. vLLM 0.26's api_server imported
`model_hosting_container_standards`, which did not travel, and `vllm serve` never started there."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "carry_imports.py"
spec = importlib.util.spec_from_file_location("carry_imports", SCRIPT)
carry_imports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry_imports)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _wheel(folder: Path, name: str, top: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{top}/__init__.py", "")
        whl.writestr(f"{name}-1.0.dist-info/METADATA", "")


def _vllm(tmp_path: Path) -> Path:
    return _tree(
        tmp_path / "x",
        {
            "vllm/__init__.py": "import json\nimport torch\n",
            "vllm/v1/__init__.py": "",
            "vllm/v1/engine/__init__.py": "import msgspec\n",
            "vllm/v1/engine/async_llm.py": "from vllm.v1.engine import core\n",
            "vllm/v1/engine/core.py": "import zmq\n",
            "vllm/entrypoints/__init__.py": "",
            "vllm/entrypoints/openai/__init__.py": "",
            "vllm/entrypoints/openai/api_server.py": (
                "from typing import TYPE_CHECKING\n"
                "import uvicorn\n"
                "from ..serve import sagemaker\n"
                "from vllm.v1.engine.async_llm import x\n"
                "try:\n    import uvloop\nexcept ImportError:\n    uvloop = None\n"
                "if TYPE_CHECKING:\n    import typeshed_only\n"
                "def later():\n    import lazily_imported\n"
            ),
            "vllm/entrypoints/serve/__init__.py": "",
            "vllm/entrypoints/serve/sagemaker.py": "from model_hosting_container_standards import common\n",
        },
    )


def test_a_module_only_vllm_serve_needs_is_named_with_its_importer(tmp_path):
    root = _vllm(tmp_path)
    _wheel(tmp_path / "whl", "uvicorn", "uvicorn")
    gaps = carry_imports.missing(root, [tmp_path / "whl"])
    # torch, msgspec, zmq: the engine imports them too, so the image or the carry has them; the
    # standard library, optional (try), type-only and function-level imports are not needed to start
    assert gaps == {"model_hosting_container_standards": "vllm.entrypoints.serve.sagemaker"}


def test_carrying_the_wheel_closes_the_gap_and_the_script_says_so(tmp_path):
    root = _vllm(tmp_path)
    _wheel(tmp_path / "whl", "uvicorn", "uvicorn")
    run = [sys.executable, str(SCRIPT), str(root), str(tmp_path / "whl")]
    refused = subprocess.run(run, capture_output=True, text=True)
    assert refused.returncode == 1
    assert "model_hosting_container_standards (from vllm.entrypoints.serve.sagemaker)" in refused.stderr
    _wheel(tmp_path / "whl", "model_hosting_container_standards", "model_hosting_container_standards")
    assert subprocess.run(run, capture_output=True, text=True).returncode == 0


def test_every_carry_is_checked_when_it_is_made():
    # what the recipe carries for vllm serve 0.26: test_measure_issue57's test of the carry's pins
    carry = (ROOT / "scripts" / "gpu" / "prepare_vllm_carry.sh").read_text()
    assert "scripts/gpu/carry_imports.py" in carry
