"""The slow tier: no model, but heavy inputs or waits (large videos and bodies, timeouts, fuzzing).
Every test in this folder is marked `slow`."""

from tests.helpers.tiers import mark_folder

pytest_itemcollected = mark_folder(__file__, "slow")
