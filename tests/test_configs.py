"""The Grafana dashboard queries only metrics the rollout workers really export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METRIC_RE = re.compile(r"\bray_specroll_[a-z0-9_]+")


class _Recorder:
    """Stands in for ray.util.metrics' Counter / Gauge: keeps the names WorkerMetrics declares."""

    declared: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, name, description="", tag_keys=()):
        self.declared.append((type(self).__name__, name))


class Counter(_Recorder):
    pass


class Gauge(_Recorder):
    pass


def exported_names(monkeypatch) -> set[str]:
    """Prometheus names as Ray serves them: `ray_` prefix, counters suffixed `_total`."""
    metrics = pytest.importorskip("specroll.integrations.ray_backend.metrics")
    _Recorder.declared = []
    monkeypatch.setattr(metrics, "Counter", Counter)
    monkeypatch.setattr(metrics, "Gauge", Gauge)
    metrics.WorkerMetrics(0)
    return {f"ray_{name}" + ("_total" if kind == "Counter" else "") for kind, name in _Recorder.declared}


def test_every_dashboard_query_names_an_exported_metric(monkeypatch):
    exported = exported_names(monkeypatch)
    dashboard = json.loads((CONFIGS / "grafana_dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert queries
    for expr in queries:
        names = METRIC_RE.findall(expr)
        assert names, f"query names no specroll metric: {expr}"
        assert set(names) <= exported, f"{expr}: {set(names) - exported} not exported; exported: {exported}"


def test_dashboard_covers_every_exported_metric(monkeypatch):
    dashboard = json.loads((CONFIGS / "grafana_dashboard.json").read_text())
    queried = {n for panel in dashboard["panels"] for t in panel["targets"] for n in METRIC_RE.findall(t["expr"])}
    assert exported_names(monkeypatch) <= queried
