"""Where the drafter runs and whether it drafts beside verification: `device` (what `EngineConfig.drafter_device`
means), `threads` (the drafter's own pinned OS thread on a CPU, the target's cores for a generate call) and `ahead`
(the drafter that drafts step t + 1 while the target verifies step t: PEARL's pre-verify / post-verify)."""
