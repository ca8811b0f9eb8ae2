"""What tests share: servers (in process or as child processes) and HTTP helpers (servers), the
episodes they send (episodes), the Ray clusters a test starts (ray_nodes), RLinf trees and runs
(rlinf), and the tier mark each folder's conftest applies (tiers)."""
