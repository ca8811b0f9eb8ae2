"""The maniskill tier: RLinf's ManiskillEnv on ManiSkill 3 in the simulator's environment. Every
test in this folder is marked `maniskill`."""

from tests.helpers.tiers import mark_folder

pytest_itemcollected = mark_folder(__file__, "maniskill")
