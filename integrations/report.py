"""The end-of-run report of `specroll train`: one folder with an HTML page, its plots and the data.

    files = write_report(out_dir, history, speed, resolved_config, summary)

Contents of `out_dir`:

- `report.html` — the summary table and four plots, each under a heading that names it (`PLOTS`).
  Acceptance is plotted as expected acceptance Σ min(p, q) on the learner's held-out positions,
  the same positions for both drafters; the per-drafted-token rate measured in rollouts
  (`rollout/acceptance_rate`, in the JSONL) also falls when auto-γ drafts further, so it is no
  measure of drift;
- `reward.png`, `tokens_per_s.png`, `acceptance.png`, `gamma_live_batch.png`;
- `metrics.jsonl` — one JSON object per logged trainer step (TRL's own keys plus `rollout/*`,
  `drafter/*`, `weights/sync_s`);
- `config.yaml` — the resolved config (every default filled in); `summary.json` — the headline numbers.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: the job runs headless (CI, ray job submit)
import matplotlib.pyplot as plt
import yaml

# file stem -> heading in report.html
PLOTS = {
    "reward": "Reward per step",
    "tokens_per_s": "Rollout tokens/s per step vs plain decoding",
    "acceptance": "Acceptance per step: online drafter vs frozen shadow",
    "gamma_live_batch": "γ and live batch over one rollout",
}


@dataclass
class SpeedMeasurement:
    """Speculative vs plain decoding on the same prompts with the final policy and drafter.

    `gamma_per_step` / `live_rows_per_step` trace one speculative rollout batch, step by step.
    """

    spec_tokens_per_s: float
    plain_tokens_per_s: float
    acceptance_rate: float
    mean_accepted_len: float
    gamma_per_step: list[int]
    live_rows_per_step: list[int]

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else math.nan


@dataclass
class ReportFiles:
    html: Path
    metrics: Path
    config: Path
    summary: Path
    plots: dict[str, Path]


def write_report(out_dir: str | Path, history: list[dict[str, Any]], speed: SpeedMeasurement,
                 config: dict[str, Any], summary: dict[str, Any]) -> ReportFiles:
    """Write the report folder (created if needed); returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = [entry for entry in history if "step" in entry and "reward" in entry]
    metrics_path = out / "metrics.jsonl"
    with metrics_path.open("w") as f:
        for entry in history:
            f.write(json.dumps(entry) + "\n")
    config_path = out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    summary = {**summary, "speed": {**asdict(speed), "speedup": speed.speedup}}
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2))
    plots = {
        "reward": _plot_series(out / "reward.png", PLOTS["reward"], steps, {"reward": "mean reward"}),
        "tokens_per_s": _plot_tokens_per_s(out / "tokens_per_s.png", steps, speed),
        "acceptance": _plot_series(out / "acceptance.png", PLOTS["acceptance"], steps, {
            "drafter/acceptance_before": "online drafter (expected, held-out)",
            "drafter/acceptance_frozen_shadow": "frozen shadow (expected, same positions)",
        }),
        "gamma_live_batch": _plot_trace(out / "gamma_live_batch.png", speed),
    }
    html_path = out / "report.html"
    html_path.write_text(_html(summary, plots))
    return ReportFiles(html_path, metrics_path, config_path, summary_path, plots)


def _plot_series(path: Path, title: str, steps: list[dict], keys: dict[str, str]) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for key, label in keys.items():
        points = [(e["step"], e[key]) for e in steps if e.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
    ax.set(title=title, xlabel="GRPO step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, path)


def _plot_tokens_per_s(path: Path, steps: list[dict], speed: SpeedMeasurement) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    points = [(e["step"], e["rollout/tokens_per_s"]) for e in steps if e.get("rollout/tokens_per_s")]
    if points:
        ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label="specroll rollouts (training)")
    ax.axhline(speed.spec_tokens_per_s, color="tab:green", ls="--",
               label=f"speculative, end of run: {speed.spec_tokens_per_s:.0f}")
    ax.axhline(speed.plain_tokens_per_s, color="tab:red", ls=":",
               label=f"plain decoding, end of run: {speed.plain_tokens_per_s:.0f}")
    ax.set(title=PLOTS["tokens_per_s"], xlabel="GRPO step", ylabel="tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _plot_trace(path: Path, speed: SpeedMeasurement) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(speed.gamma_per_step))
    ax.step(x, speed.gamma_per_step, where="post", color="tab:blue", label="γ (drafted tokens)")
    ax.set(title=PLOTS["gamma_live_batch"], xlabel="decode step", ylabel="γ")
    live_ax = ax.twinx()
    live_ax.step(x, speed.live_rows_per_step, where="post", color="tab:orange", label="live rows")
    live_ax.set_ylabel("live rows")
    handles = ax.get_legend_handles_labels()[0] + live_ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _html(summary: dict[str, Any], plots: dict[str, Path]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in _flatten(summary).items()
        if not isinstance(v, list)
    )
    figures = "".join(
        f'<h2>{html.escape(PLOTS[stem])}</h2><img src="{path.name}" alt="{html.escape(PLOTS[stem])}">'
        for stem, path in plots.items()
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>specroll train report</title>"
        "<style>body{font-family:sans-serif;max-width:860px;margin:2em auto}"
        "th{text-align:left;padding-right:1em}img{max-width:100%}</style></head><body>"
        f"<h1>specroll train report</h1><table>{rows}</table>{figures}"
        "<p>Data: <a href='metrics.jsonl'>metrics.jsonl</a>, <a href='config.yaml'>config.yaml</a>, "
        "<a href='summary.json'>summary.json</a></p></body></html>"
    )


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
