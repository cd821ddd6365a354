"""The end-of-run report of `specroll train`: one folder with an HTML page, its plots and the data.

    files = write_report(out_dir, history, speed, resolved_config, summary)

Contents of `out_dir`:

- `report.html` — first what online learning bought (`learning_headline`: online − frozen at the last
  probe with its interval, versions published, the learner's alarms, a verdict), then the summary
  table, the learner's events (watchdog reverts, candidate resets, alarms) and five plots, each under
  a heading that names it (`PLOTS`). Drift is plotted on the *probe set*:
  fixed prompts, fresh samples at each probed policy version, never trained on, online (served)
  and frozen drafter scored by expected acceptance Σ min(p, q) on the same positions, each with a
  95% band, and their paired difference with its 95% interval. The learner's held-out numbers
  (recency-weighted, they move with the prompts a step drew) are a secondary plot; the
  per-drafted-token rate measured in rollouts (`rollout/acceptance_rate`, in the JSONL) also falls
  when auto-γ drafts further, so it is no measure of drift;
- `reward.png` (per step and a rolling mean), `tokens_per_s.png`, `probe.png`, `acceptance.png`,
  `gamma_live_batch.png`, `accepted_live_batch.png` (tokens per row per target call — the accepted length — by
  the live batch the step ran at: where trees or longer chains pay, docs/metrics.md);
- `metrics.jsonl` — one JSON object per logged trainer step (TRL's own keys plus `rollout/*`,
  `drafter/*`, `weights/sync_s`); it and `probes.jsonl` are written at every checkpoint too (`write_data`);
- `config.yaml` — the resolved config (every default filled in); `summary.json` — the headline numbers.

A run resumed from a checkpoint (`specroll train --resume`, docs/resume.md) writes the report of the whole run:
its history and probes go on from the checkpoint's; the page says where it resumed (`summary["resumed"]`), and
the reward plot marks the step.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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
    "probe": "Drift on the probe set: online drafter vs frozen shadow",
    "acceptance": "Held-out acceptance per learner round (secondary)",
    "gamma_live_batch": "γ and live batch over one rollout",
    "accepted_live_batch": "Accepted length (tokens per row per target call) against live batch",
}
ROLLING = 5  # steps in the reward's rolling mean
Z95 = 1.96


@dataclass
class SpeedMeasurement:
    """Speculative vs plain decoding on the same prompts with the final policy and drafter.

    `gamma_per_step` / `live_rows_per_step` / `tokens_per_step` trace one speculative rollout batch, step by step
    (`tokens_per_step` empty: not traced).
    """

    spec_tokens_per_s: float
    plain_tokens_per_s: float
    acceptance_rate: float
    mean_accepted_len: float
    gamma_per_step: list[int]
    live_rows_per_step: list[int]
    tokens_per_step: list[int] = field(default_factory=list)

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


def learning_headline(probes: list[dict[str, float]], num_published: int, num_rounds: int, alarms: list[str],
                      online_learning: bool = True) -> dict[str, Any]:
    """What online learning bought, at a glance: online − frozen at the last probe (points, with its 95%
    interval), the versions published, the learner's alarms, and a verdict that cannot read as a success
    when learning did nothing. The first lines of the report, `summary.json` and the run's closing output."""
    headline: dict[str, Any] = {"versions_published": num_published, "learner_rounds": num_rounds,
                                "alarms": list(alarms)}
    if not online_learning:
        return {**headline, "verdict": "online learning off: the drafter stayed as loaded"}
    if not probes:
        return {**headline, "verdict": "no probe in this run (probe.prompts: 0): it cannot say what online "
                                       "learning bought"}
    last = probes[-1]
    gain, half = 100 * last["drafter/probe_gain"], 100 * Z95 * last["drafter/probe_gain_se"]
    helped = gain - half > 0
    verdict = ("online learning helped: the online drafter is above the frozen one beyond the interval" if helped
               else "WARNING: online learning bought nothing measurable: the interval of online − frozen "
                    "includes 0 or is below it")
    return {**headline, "online_minus_frozen_points": gain, "interval95_points": [gain - half, gain + half],
            "probe_step": last["step"], "online": last["drafter/probe_online"], "frozen": last["drafter/probe_frozen"],
            "helped": helped, "verdict": verdict}


def headline_lines(headline: dict[str, Any]) -> list[str]:
    """`learning_headline` as the few lines a person reads first."""
    lines = []
    if "online_minus_frozen_points" in headline:
        low, high = headline["interval95_points"]
        lines.append(f"online drafter vs frozen at the last probe (policy version {headline['probe_step']}): "
                     f"{headline['online_minus_frozen_points']:+.1f} points (95% interval {low:+.1f} to {high:+.1f}; "
                     f"{headline['online']:.3f} vs {headline['frozen']:.3f})")
    lines.append(f"{headline['versions_published']} drafter versions published in {headline['learner_rounds']} "
                 f"learner rounds; {len(headline['alarms']) or 'no'} learner alarm"
                 f"{'' if len(headline['alarms']) == 1 else 's'}")
    lines.extend(f"ALARM {line}" for line in headline["alarms"])
    lines.append(headline["verdict"])
    return lines


def write_report(out_dir: str | Path, history: list[dict[str, Any]], speed: SpeedMeasurement,
                 config: dict[str, Any], summary: dict[str, Any], events: list[str] | None = None,
                 probes: list[dict[str, float]] | None = None) -> ReportFiles:
    """Write the report folder (created if needed); returns the paths written. `events`: the
    learner's event lines (watchdog reverts, candidate resets), listed on the page; `probes`: one
    dict per probe, `step` the policy version probed and the `drafter/probe_*` numbers (also written
    to `probes.jsonl`)."""
    out = Path(out_dir)
    steps = [entry for entry in history if "step" in entry and "reward" in entry]
    metrics_path = write_data(out, history, probes or [])
    config_path = out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    summary = {**summary, "speed": {**asdict(speed), "speedup": speed.speedup}}  # "headline" stays first
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2))
    plots = {
        "reward": _plot_reward(out / "reward.png", steps, [r["step"] for r in summary.get("resumed", [])]),
        "tokens_per_s": _plot_tokens_per_s(out / "tokens_per_s.png", steps, speed),
        "probe": _plot_probe(out / "probe.png", probes or []),
        "acceptance": _plot_series(out / "acceptance.png", PLOTS["acceptance"], steps, {
            "drafter/acceptance_before": "online drafter (expected, held-out)",
            "drafter/acceptance_frozen_shadow": "frozen shadow (expected, same positions)",
        }, ylabel="expected acceptance Σ min(p, q)"),
        "gamma_live_batch": _plot_trace(out / "gamma_live_batch.png", speed),
        "accepted_live_batch": _plot_accepted(out / "accepted_live_batch.png", speed),
    }
    html_path = out / "report.html"
    html_path.write_text(_html(summary, plots, events or []))
    return ReportFiles(html_path, metrics_path, config_path, summary_path, plots)


def write_data(out_dir: str | Path, history: list[dict[str, Any]], probes: list[dict[str, Any]]) -> Path:
    """`metrics.jsonl` and `probes.jsonl` (the folder created if needed), each replaced whole (written aside,
    then renamed); returns the metrics file's path. The report writes them at the end of a run, a checkpointing
    run at every checkpoint too (`resume.ResumeCallback`): a killed run leaves its data up to its last one, and
    the run resumed from it writes the same lines first."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, entries in (("metrics.jsonl", history), ("probes.jsonl", probes)):
        tmp = out / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        tmp.replace(out / name)
    return out / "metrics.jsonl"


def _plot_series(path: Path, title: str, steps: list[dict], keys: dict[str, str], ylabel: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for key, label in keys.items():
        points = [(e["step"], e[key]) for e in steps if e.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
    ax.set(title=title, xlabel="GRPO step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, path)


def _plot_reward(path: Path, steps: list[dict], resumed_at: Sequence[int] = ()) -> Path:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, step in enumerate(resumed_at):
        ax.axvline(step, color="gray", ls="--", lw=0.8, label="resumed from a checkpoint" if i == 0 else None)
    points = [(e["step"], e["reward"]) for e in steps if e.get("reward") is not None]
    if points:
        x, y = zip(*points, strict=True)
        ax.plot(x, y, marker="o", markersize=3, alpha=0.5, label="mean reward of the step's completions")
        rolling = [sum(y[max(0, i - ROLLING + 1) : i + 1]) / len(y[max(0, i - ROLLING + 1) : i + 1])
                   for i in range(len(y))]
        ax.plot(x, rolling, color="tab:red", label=f"rolling mean over {ROLLING} steps")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set(title=PLOTS["reward"], xlabel="GRPO step", ylabel="reward")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _plot_probe(path: Path, probes: list[dict]) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.4), sharex=True, height_ratios=(3, 2))
    x = [e["step"] for e in probes]
    for key, label, color in (("online", "online drafter (served)", "tab:blue"),
                              ("frozen", "frozen shadow (step-0 drafter)", "tab:gray")):
        y = [e[f"drafter/probe_{key}"] for e in probes]
        band = [Z95 * e[f"drafter/probe_{key}_se"] for e in probes]
        top.plot(x, y, marker="o", markersize=3, color=color, label=label)
        top.fill_between(x, [a - b for a, b in zip(y, band)], [a + b for a, b in zip(y, band)], color=color,
                         alpha=0.15)
    top.set(title=PLOTS["probe"], ylabel="expected acceptance Σ min(p, q)")
    gain = [e["drafter/probe_gain"] for e in probes]
    half = [Z95 * e["drafter/probe_gain_se"] for e in probes]
    bottom.errorbar(x, gain, yerr=half, marker="o", markersize=3, capsize=3, color="tab:green",
                    label="online − frozen, paired (95% interval)")
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set(xlabel="GRPO step (policy version probed)", ylabel="Δ acceptance")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not probes:
        top.text(0.5, 0.5, "no probe in this run", ha="center", va="center", transform=top.transAxes)
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


def _plot_accepted(path: Path, speed: SpeedMeasurement) -> Path:
    """Mean tokens per row per step (one target call each) at each live batch size of the traced batch."""
    by_live: dict[int, list[float]] = {}
    for rows, tokens in zip(speed.live_rows_per_step, speed.tokens_per_step):
        by_live.setdefault(rows, []).append(tokens / rows)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    sizes = sorted(by_live)
    ax.plot(sizes, [sum(by_live[b]) / len(by_live[b]) for b in sizes], marker="o", color="tab:green")
    ax.set(title=PLOTS["accepted_live_batch"], xlabel="live rows", ylabel="tokens per row per target call")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _html(summary: dict[str, Any], plots: dict[str, Path], events: list[str]) -> str:
    listed = "".join(f"<li>{html.escape(line)}</li>" for line in events) or "<li>none</li>"
    lines = headline_lines(summary["headline"]) if "headline" in summary else []
    lines += [f"resumed at step {r['step']} from {r['checkpoint']}" for r in summary.get("resumed", [])]
    top = "".join(f"<p class='{'alarm' if line.startswith(('ALARM', 'WARNING')) else 'headline'}'>"
                  f"{html.escape(line)}</p>" for line in lines)
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
        "th{text-align:left;padding-right:1em}img{max-width:100%}.headline{font-weight:bold}"
        ".alarm{font-weight:bold;color:#b00}</style></head><body>"
        f"<h1>specroll train report</h1>{top}<table>{rows}</table><h2>Learner events</h2><ul>{listed}</ul>{figures}"
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
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
