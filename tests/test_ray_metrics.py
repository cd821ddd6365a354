"""Workers' Prometheus metrics, scraped from the nodes' metrics export endpoints in text format."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from ray_helpers import GREEDY, prompts_for

from specroll.integrations.ray_backend.metrics import prometheus_urls

EXPECTED = {
    "ray_specroll_rollout_tokens",  # a counter: samples are ray_specroll_rollout_tokens_total
    "ray_specroll_rollout_tokens_per_s",
    "ray_specroll_acceptance_rate",
    "ray_specroll_mean_accepted_len",
    "ray_specroll_gamma",
    "ray_specroll_live_batch",
    "ray_specroll_policy_version",
    "ray_specroll_drafter_version",
    "ray_specroll_sync_seconds",
}



def scrape() -> dict:
    families = {}
    for url in prometheus_urls():
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        families.update({f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("ray_specroll")})
    return families


def test_worker_metrics_reach_the_prometheus_endpoint(controller):
    controller.sync_policy({}, version=controller.policy_version + 1)
    controller.generate(prompts_for(4), GREEDY, n=2)
    deadline, families = time.monotonic() + 60, {}
    while time.monotonic() < deadline and not complete(families, controller):
        time.sleep(1.0)  # the metrics agent exports on an interval (a few seconds)
        families = scrape()
    assert complete(families, controller), sorted(EXPECTED - set(families))
    assert families["ray_specroll_rollout_tokens"].type == "counter"
    tokens = sum(s.value for s in families["ray_specroll_rollout_tokens"].samples if s.name.endswith("_total"))
    assert tokens > 0


def complete(families: dict, controller) -> bool:
    """Every series is there and the version gauge shows the controller's current policy version."""
    family = families.get("ray_specroll_policy_version")
    seen = family is not None and controller.policy_version in {s.value for s in family.samples}
    return seen and set(families) >= EXPECTED
