"""The tier of a test is the folder it is in: each tier folder's conftest marks its tests, so
`-m engine` (and the others) select by folder and no test file repeats its tier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def mark_folder(conftest: str, tier: str) -> Callable[[pytest.Item], None]:
    """A `pytest_itemcollected` hook for the conftest at `conftest`: every test collected under
    its folder gets the `tier` mark (before -m selects, and before the --docker skip looks)."""
    folder = Path(conftest).resolve().parent
    mark = getattr(pytest.mark, tier)

    def pytest_itemcollected(item: pytest.Item) -> None:
        if folder in Path(item.path).resolve().parents:
            item.add_marker(mark)

    return pytest_itemcollected
