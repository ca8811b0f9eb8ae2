"""The maniskill tier: RLinf's ManiskillEnv on ManiSkill 3 in the simulator's environment. Every
test in this folder is marked `maniskill`."""

import pytest

from tests.helpers import rlinf
from tests.helpers.tiers import mark_folder

pytest_itemcollected = mark_folder(__file__, "maniskill")


@pytest.fixture(scope="module")
def maniskill_python() -> str:
    """The simulator venv's python, with ManiSkill in it."""
    return rlinf.maniskill_python()
