"""The docker tier: the server's CPU image built and run on a Docker engine; opt-in with --docker.
Every test in this folder is marked `docker`."""

from tests.helpers.tiers import mark_folder

pytest_itemcollected = mark_folder(__file__, "docker")
