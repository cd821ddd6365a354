"""What the Ray controller does at a drafter event — a publish, a learner restart, a batch that kept almost no drafts:
sync the learner's published drafter to the workers, checked by its digest (`drafter_guard`), and revert a collapsed
one through the learner's watchdog. A mixin of `RolloutController` (its workers, learner, transport and checks)."""

from __future__ import annotations

import warnings
from typing import Any

import ray

from .sync.protocol import WeightSyncError


class DrafterEvents:
    """`RolloutController`'s drafter-event handling (module docstring)."""

    def _publish(self, version: int, event: str) -> None:
        """Sync the learner's published drafter (`version`) to every worker, checked by the learner's digest, then
        verify what each serves. A refused sync (corrupted in flight) keeps the served version: an event, and the
        next `generate` syncs again."""
        timeout = self.config.sync.timeout_s
        self.learner_version = version
        published = ray.get(self.learner.published_drafter.remote(), timeout=timeout)
        digest = ray.get(self.learner.published_digest.remote(self.config.engine.dtype), timeout=timeout)
        try:
            self.sync_drafter(published.with_number(version), digest)
        except WeightSyncError as err:
            self.watch.events.append(f"{event}: drafter version {version} refused, version {self.drafter_version} "
                                     f"kept on every worker ({err})")
            warnings.warn(f"drafter sync to version {version} refused ({err}); serving version "
                          f"{self.drafter_version}", stacklevel=2)
            return
        self.guard.published(version, digest)
        self.guard.verify(f"{event} of version {version}", self.workers)

    def _after_learner_restart(self) -> None:
        """The restored learner publishes what it published at its last state: what the workers serve (checked), or
        else synced to them as it is."""
        timeout = self.config.sync.timeout_s
        version = ray.get(self.learner.published_version.remote(), timeout=timeout)
        digest = ray.get(self.learner.published_digest.remote(self.config.engine.dtype), timeout=timeout)
        if (version, digest) != (self.drafter_version, self.guard.digest):
            self._publish(version, "learner restart")
        else:
            self.guard.verify("learner restart", self.workers)

    def _check_batches(self, batches: list[Any]) -> None:
        """The drafter checks after a generate call: the served digests checked when a worker restarted since its
        last batch, and the first batch after a drafter event judged for a collapse (alarm, event, revert)."""
        if self.guard.restarted(batches):
            self.guard.verify("worker restart", self.workers)
        collapsed, stats = self.guard.judge(batches)
        if not collapsed:
            return
        estimate = ray.get(self.learner.served_estimate.remote(), timeout=self.config.sync.timeout_s)
        if not self.watch.collapse_confirmed(collapsed, stats, estimate, self.drafter_version):
            return
        self.guard.verify("drafter collapse", self.workers)  # weights that changed under a worker are reloaded
        reason = (f"rollouts: {', '.join(collapsed)} kept almost no drafts of version {self.drafter_version}, "
                  f"whose held-out estimate is {estimate:.3f}")
        self.watch.events.append(ray.get(self.learner.revert_served.remote(reason), timeout=self.config.sync.timeout_s))
        self._publish(ray.get(self.learner.published_version.remote(), timeout=self.config.sync.timeout_s),
                      "watchdog revert")
