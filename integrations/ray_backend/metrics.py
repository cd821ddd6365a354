"""Prometheus metrics of the rollout workers, exported through `ray.util.metrics`.

Each `RolloutWorker` owns one `WorkerMetrics` and records after every batch (its `BatchStats`, the
same numbers the backends log: docs/metrics.md) and every weight sync.
Ray's metrics agent on each node serves them on the node's metrics export port, prefixed `ray_`;
`prometheus_urls()` lists those endpoints (what a Prometheus scrape config, the Grafana dashboard
and the tests read). Counters are named without `_total`: Ray (OpenTelemetry) appends it.

Names (all tagged `worker`; sync metrics also `role` = policy | drafter):
`specroll_rollout_tokens` (counter), `specroll_rollout_tokens_per_s`, `specroll_acceptance_rate`,
`specroll_mean_accepted_len`, `specroll_gamma`, `specroll_live_batch`, `specroll_policy_version`,
`specroll_drafter_version`, `specroll_sync_seconds`. The learner actor's `LearnerMetrics` (untagged):
`specroll_learner_steps`, `specroll_learner_budget_seconds`, `specroll_learner_version`,
`specroll_learner_alarms` (alarm conditions holding: it stopped learning) and `specroll_learner_alarms_raised`.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.metrics import Counter, Gauge

from specroll.rollout.core.stats import BatchStats


class WorkerMetrics:
    """The Prometheus series of one worker; create it inside the actor (metrics need a Ray worker)."""

    def __init__(self, worker_index: int):
        self._tags = {"worker": str(worker_index)}
        keys = ("worker",)
        self.tokens = Counter("specroll_rollout_tokens", "Generated rollout tokens.", tag_keys=keys)
        self.gauges = {
            name: Gauge(f"specroll_{name}", doc, tag_keys=keys)
            for name, doc in (
                ("rollout_tokens_per_s", "Rollout tokens per second of the last batch."),
                ("acceptance_rate", "Fraction of drafted tokens accepted in the last batch."),
                ("mean_accepted_len", "Tokens emitted per row per speculative step in the last batch."),
                ("gamma", "Gamma per engine step (plain steps as 0) in the last batch."),
                ("live_batch", "Mean live rows per step in the last batch."),
                ("policy_version", "Policy version the worker serves."),
                ("drafter_version", "Drafter version the worker serves."),
            )
        }
        self.sync_seconds = Gauge("specroll_sync_seconds", "Seconds the last weight sync took.",
                                  tag_keys=("worker", "role"))

    def record_batch(self, batch: BatchStats) -> None:
        if batch.generated_tokens:
            self.tokens.inc(batch.generated_tokens, tags=self._tags)
        for name, value in (
            ("rollout_tokens_per_s", batch.tokens_per_s),
            ("acceptance_rate", batch.acceptance_rate),
            ("mean_accepted_len", batch.mean_accepted_len),
            ("gamma", batch.mean_gamma),
            ("live_batch", batch.mean_live_rows),
        ):
            self.gauges[name].set(value, tags=self._tags)

    def record_versions(self, policy_version: int, drafter_version: int) -> None:
        self.gauges["policy_version"].set(policy_version, tags=self._tags)
        self.gauges["drafter_version"].set(drafter_version, tags=self._tags)

    def record_sync(self, role: str, seconds: float) -> None:
        self.sync_seconds.set(seconds, tags={**self._tags, "role": role})


class LearnerMetrics:
    """The Prometheus series of the learner actor, set after every round: whether it is still learning."""

    def __init__(self):
        self.gauges = {
            name: Gauge(f"specroll_learner_{name}", doc)
            for name, doc in (
                ("steps", "Optimizer steps the last learner round took."),
                ("budget_seconds", "Seconds the last learner round was given."),
                ("version", "Drafter version the learner publishes."),
                ("alarms", "Learner alarm conditions holding (stalled, publishes nothing, probe slower than a round)."),
            )
        }
        self.raised = Counter("specroll_learner_alarms_raised", "Learner alarms raised.")

    def record_round(self, report: Any) -> None:
        for name, value in (("steps", report.num_steps), ("budget_seconds", report.budget_s or 0.0),
                            ("version", report.version), ("alarms", report.alarms_active)):
            self.gauges[name].set(float(value))
        if report.alarms:
            self.raised.inc(len(report.alarms))


def prometheus_urls() -> list[str]:
    """The Prometheus text endpoint of every live node's metrics agent (call after `ray.init`)."""
    return [
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for node in ray.nodes()
        if node["Alive"]
    ]
