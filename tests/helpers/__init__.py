"""What tests share: servers (in process or as child processes) and HTTP helpers (servers), the
episodes they send (episodes), stand-ins for RLinf's env objects (envs), RLinf trees, checkouts
and the simulator's environment (rlinf), the tiny training runs (tiny_runs), the Ray clusters a
test starts (ray_nodes), and the tier mark each folder's conftest applies (tiers)."""
