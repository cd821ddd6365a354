"""The engine's bookkeeping, no model math: a request's state and the `Rollout` it becomes (`request`), the live
batch as device tensors (`batch`), which request runs in which slot (`scheduler`), appending a verified step
(`append`), the counters (`stats`), decayed acceptance rates (`rates`) and `generate`'s argument checks
(`validate`)."""
