"""Replay a recorded run's online learner under other settings: how the demo's learner settings are chosen.

    specroll train --config configs/demo.yaml        # with learner.record_dir: rec/ in the YAML
    python -m specroll.tools.learner_replay rec/ --seeds 0,1,2,3 --set lr=2e-3 --set buffer.recency_decay=0.5

A recording (`online_drafter.recording`) holds every input the learner got: each step's rollouts with
their signals, each round's budget and break-even, each probe's rollouts. With `engine.sampler:
invariant` every run of a config produces the same rollouts whatever its learner does, so a replay
shows what other learner settings would have served on the very same run. What differs between real
runs of one config is timing (which batches a round gets through), so the replay runs several learner
seeds and reports the spread: a setting is better only if it wins across seeds.

Time is virtual, so a replay is deterministic and machine load does not bias it: each drafter forward
costs `fixed + per_token × padded tokens` milliseconds (`--train-cost` with its backward, `--eval-cost`
without; defaults measured for the demo drafter on one thread of the 2-core machine), scaled by
`--slow` (in the main job the learner shares the cores with the trainer: `--slow 1.5` gives about its
step count). Each round gets its recorded budget plus the time the replay's earlier rounds took less than
the run's (or minus what they took more), as the run's cumulative schedule would have given it.

Prints, per seed, every probe's served − frozen gain (paired s.e.) and the learner's totals; then the
final probe's gain across seeds. A drafter LM's learner or a head's (`HeadLearner`, with the policy
modules it reads as recorded at every sync).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import yaml

from specroll.integrations.yaml_config import from_dict
from specroll.online_drafter import DraftLearner, LearnerConfig, autocast
from specroll.online_drafter.heads.block_learner import BlockLearner
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.online_drafter.learner_config import BufferConfig
from specroll.online_drafter.recording import recorded_calls
from specroll.online_drafter.reports import ProbeReport
from specroll.rollout.drafters.block_head import BlockHead

TRAIN_COST_MS = (6.8, 0.106)  # per optimizer step's forward + backward: fixed, per padded token
EVAL_COST_MS = (2.0, 0.034)  # per scoring forward
HEAD_TRAIN_COST_MS = (5.0, 0.376)  # the demo's EAGLE head (2.36M, MLP 512, both draft depths), measured alike
HEAD_EVAL_COST_MS = (1.0, 0.125)
# The head learner's other settings (`compute_dtype`, `train_depths` 1), measured alike in one later session, where
# the fp32 both-depth step measured (1.1, 0.414) and its scoring (8.2, 0.115): within 7% of the constants above at
# the main job's ~450 padded tokens a step.
HEAD_COSTS_MS = {  # (compute_dtype, first depth only) -> (train, scoring under the learner's autocast)
    ("float32", False): (HEAD_TRAIN_COST_MS, HEAD_EVAL_COST_MS),
    ("bfloat16", False): ((7.8, 0.254), (5.0, 0.065)),
    ("float32", True): ((6.7, 0.187), HEAD_EVAL_COST_MS),
    ("bfloat16", True): ((9.7, 0.126), (5.0, 0.065)),
}


@dataclass
class Replay:
    """One seed's replay: every probe, and the learner's totals."""

    seed: int
    probes: list[ProbeReport] = field(default_factory=list)
    num_steps: int = 0
    num_gates: int = 0
    num_published: int = 0
    train_s: float = 0.0
    eval_s: float = 0.0
    round_s: float = 0.0
    events: list[str] = field(default_factory=list)


def replay(folder: str, seed: int = 0, overrides: dict[str, Any] | None = None,
           train_cost_ms: tuple[float, float] | None = None, eval_cost_ms: tuple[float, float] | None = None,
           slow: float = 1.0) -> Replay:
    """Rerun the recorded learner inputs in `folder` with `overrides` of its `LearnerConfig` (dotted keys
    for the buffer: `buffer.recency_decay`) and learner `seed`, on a virtual clock (costs None: the
    recorded drafter kind's defaults)."""
    init, calls = recorded_calls(folder)
    config = apply_overrides(init["config"], {**(overrides or {}), "seed": seed, "record_dir": None})
    reads = {name: copy.deepcopy(module) for name, module in (init.get("reads") or {}).items()}
    head = bool(reads)
    block = isinstance(init["drafter"], BlockHead)
    if head:  # a head's learner, reading its own copy of the policy's embedding and LM head
        kind = BlockLearner if block else HeadLearner
        learner = kind(copy.deepcopy(init["drafter"]), reads["embed"], reads["lm_head"], config)
    else:
        learner = DraftLearner(copy.deepcopy(init["drafter"]), config)
    dtype = config.compute_dtype  # "auto": what the learner resolves it to on this machine
    if dtype == "auto":
        dtype = "float32" if autocast.resolve(dtype, config.device) is None else "bfloat16"
    if not head and dtype != "float32" and not (train_cost_ms and eval_cost_ms):
        raise ValueError(f"compute_dtype={config.compute_dtype!r}: the drafter LM's costs are measured in float32 "
                         "only; pass --train-cost and --eval-cost")
    head_train, head_eval = HEAD_COSTS_MS[dtype, config.train_depths == 1]
    train_cost_ms = train_cost_ms or (head_train if head else TRAIN_COST_MS)
    eval_cost_ms = eval_cost_ms or (head_eval if head else EVAL_COST_MS)
    clock = [0.0]
    learner.clock = lambda: clock[0]

    def charge(num_tokens: int) -> None:
        fixed, per_token = train_cost_ms if torch.is_grad_enabled() else eval_cost_ms
        clock[0] += slow * (fixed + per_token * num_tokens) / 1000

    if block:  # the block scorer's one forward: every block of the batch's anchors
        block_log_q = learner.scorer.block_log_q

        def timed_block_log_q(model, batch, anchors, context_kv=None):
            charge(anchors.numel() * model.block_size)
            return block_log_q(model, batch, anchors, context_kv)

        learner.scorer.block_log_q = timed_block_log_q
    elif head:
        objective = learner.scorer.objective

        def timed_objective(model, batch, temperature, depths=None):
            charge(batch.token_ids.numel())
            return objective(model, batch, temperature, depths)

        learner.scorer.objective = timed_objective
    else:
        log_q = learner.scorer.log_q

        def timed_log_q(model, batch):
            charge(batch.input_ids.numel())
            return log_q(model, batch)

        learner.scorer.log_q = timed_log_q
    result, behind_s = Replay(seed), 0.0  # how much less time the replay's rounds took than the run's
    for call in calls:
        kind, payload = call["kind"], call["payload"]
        if kind == "add":
            learner.add_rollouts(payload)
        elif kind == "vocab":  # the engine's first draft vocabulary
            learner.set_draft_vocab(payload["ids"], payload["vocab_size"])
        elif kind == "policy":  # a head's: the policy's new embedding and LM head weights
            for name, state in payload.items():
                reads[name].load_state_dict(state)
        elif kind == "probe":
            result.probes.append(learner.probe(payload))
            if result.probes[-1].event:
                result.events.append(result.probes[-1].event)
        elif kind == "revert":  # a collapse the run's rollouts showed (`Learner.revert_served`)
            result.events.append(learner.revert_served(payload))
        elif kind == "round":
            budget = payload["budget_s"]
            if budget is not None:
                budget = max(0.0, budget + behind_s)
            report = learner.train_round(budget_s=budget, break_even=payload["break_even"])
            behind_s += payload["round_time_s"] - report.round_time_s
            result.num_steps += report.num_steps
            result.num_gates += bool(report.gated)
            result.num_published += bool(report.published)
            result.train_s += report.train_time_s
            result.eval_s += report.eval_time_s
            result.round_s += report.round_time_s
            if report.event:
                result.events.append(report.event)
        else:
            raise ValueError(f"{folder}: unknown recorded call {kind!r}")
    return result


def apply_overrides(config: dict[str, Any], overrides: dict[str, Any]) -> LearnerConfig:
    """`LearnerConfig` from a recorded config dict with `overrides` (`buffer.x` keys reach the buffer);
    an unknown key is a `ValueError` naming the known ones."""
    merged = {**config, "buffer": dict(config.get("buffer") or {})}
    allowed = {"": _field_names(LearnerConfig) - {"buffer"}, "buffer": _field_names(BufferConfig)}
    for key, value in overrides.items():  # settings newer than the recording too (its config lacks them)
        section, _, name = key.rpartition(".")
        if name not in allowed.get(section, ()):
            known = sorted(allowed[""]) + [f"buffer.{k}" for k in sorted(allowed["buffer"])]
            raise ValueError(f"--set {key}: not a learner setting; allowed: {', '.join(known)}")
        (merged["buffer"] if section else merged)[name] = value
    return from_dict(LearnerConfig, merged, "learner")  # typed as YAML is: "1e-9" is a number


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def parse_set(items: list[str]) -> dict[str, Any]:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} is invalid: write key=value, e.g. --set lr=2e-3")
        overrides[key] = yaml.safe_load(value)
    return overrides


def summary_lines(replays: list[Replay]) -> list[str]:
    lines = []
    for r in replays:
        probes = " ".join(f"v{p.policy_version}:{100 * p.gain:+.1f}±{100 * p.gain_se:.1f}" for p in r.probes)
        lines.append(f"seed {r.seed}: probes {probes} | steps {r.num_steps}, gates {r.num_gates}, published "
                     f"{r.num_published}, train {r.train_s:.1f} s + scoring {r.eval_s:.1f} s = {r.round_s:.1f} s, "
                     f"events {len(r.events)}")
    finals = [100 * r.probes[-1].gain for r in replays if r.probes]
    if finals:
        spread = statistics.stdev(finals) if len(finals) > 1 else math.nan
        lines.append(f"final probe, served − frozen: mean {statistics.mean(finals):+.2f} points, s.d. {spread:.2f} "
                     f"over {len(finals)} seeds ({', '.join(f'{g:+.1f}' for g in finals)})")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a learner recording (learner.record_dir of a run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a LearnerConfig override (buffer.x for the buffer); repeatable")
    parser.add_argument("--seeds", default="0,1,2,3", help="learner seeds, comma-separated")
    parser.add_argument("--train-cost", default=None,
                        help="ms fixed,per token (default: the recorded drafter kind's, measured here)")
    parser.add_argument("--eval-cost", default=None, help="ms fixed,per token (default: the recorded drafter kind's)")
    parser.add_argument("--slow", type=float, default=1.0, help="scale every cost (1.5: the main job's steps)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = parse_set(args.set)
    costs = [None if c is None else tuple(float(x) for x in c.split(",")) for c in (args.train_cost, args.eval_cost)]
    seeds = [int(s) for s in args.seeds.split(",")]
    replays = [replay(args.folder, s, overrides, costs[0], costs[1], args.slow) for s in seeds]
    print("\n".join(summary_lines(replays)))


if __name__ == "__main__":
    main()
