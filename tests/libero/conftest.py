"""The libero tier: RLinf's LiberoEnv in the simulator's own environment against a real reward
server. Every test in this folder is marked `libero`."""

from tests.helpers.tiers import mark_folder

pytest_itemcollected = mark_folder(__file__, "libero")
