"""What `vllm serve` imports that a vLLM carry does not bring, checked here before a lease.

    python3 scripts/gpu/carry_imports.py VLLM_TREE WHEEL_DIR...

VLLM_TREE holds the unpacked `vllm` package of the carry; WHEEL_DIR the carry's wheels. The lent
machines have no package registry, so a module that neither the image nor the carry has stops
`vllm serve` at start, after the staging calls were spent (0.26's api_server imports
`model_hosting_container_standards`, which did not travel).

What the image has is not listed anywhere; what runs there is: the server's engine
(`AsyncLLM`, the renderer, the multimodal inputs) ran on the carry. So the check follows the
module-level imports (outside `try` and `TYPE_CHECKING`) from `vllm.entrypoints.openai.api_server`
through vLLM's own modules, takes away what the engine's modules import the same way, and reports
each remaining outside package that no carried wheel provides, with the vLLM module that imports
it. The standard library is never reported. Exit status 1 when something is missing.
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

SERVE = ("vllm.entrypoints.openai.api_server",)
# what the server's engine imports: these ran on the lent machines with the carry
ENGINE = ("vllm.v1.engine.async_llm", "vllm.renderers", "vllm.sampling_params", "vllm.multimodal")


def _module_file(root: Path, module: str) -> Path | None:
    path = root / module.replace(".", "/")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imports(tree: ast.Module, package: str) -> list[str]:
    """Module-level imports that always run: not inside try (optional) or TYPE_CHECKING."""
    found: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                found.append(module)
                found.extend(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)

    visit(tree.body)
    return found


def outside_imports(root: Path, starts: tuple[str, ...]) -> dict[str, str]:
    """{outside top-level package: the vLLM module importing it} over the import closure of `starts`."""
    seen: set[str] = set()
    outside: dict[str, str] = {}
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(root, module)
        if path is None:
            continue
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for name in _imports(ast.parse(path.read_text()), package):
            top = name.split(".")[0]
            if top == "vllm":
                todo.append(name)
            elif top and top not in sys.stdlib_module_names:
                outside.setdefault(top, module)
    return outside


def carried_modules(wheel_dirs: list[Path]) -> set[str]:
    """The top-level modules the carried wheels install (from each wheel's file list)."""
    names: set[str] = set()
    for folder in wheel_dirs:
        for wheel in folder.glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    top = member.split("/")[0]
                    if top.endswith((".dist-info", ".data")):
                        continue
                    names.add(top[:-3] if top.endswith(".py") else top.split(".")[0])
    return names


def missing(root: Path, wheel_dirs: list[Path]) -> dict[str, str]:
    serve = outside_imports(root, SERVE)
    engine = outside_imports(root, ENGINE)
    carried = carried_modules(wheel_dirs)
    return {top: by for top, by in sorted(serve.items()) if top not in engine and top not in carried}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    gaps = missing(Path(argv[0]), [Path(a) for a in argv[1:]])
    for top, by in gaps.items():
        print(f"vllm serve imports {top} (from {by}): no carried wheel provides it", file=sys.stderr)
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
