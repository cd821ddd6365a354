"""Online draft learning under a real policy drift: GRPO-style updates on the demo task.

The demo reward pays a correct compact solution more than a verbose one, so policy-gradient steps
move the policy from the SFT majority style to the minority one, and a drafter fitted to the SFT
policy falls behind. Per policy version this script:

1. generates G completions per prompt with two engines holding the same policy — one whose drafter
   the learner keeps updating (online), one with the initial drafter (frozen) — in alternating order;
2. takes a minimal GRPO step on the online rollouts (group-normalised reward advantage × sequence
   log-likelihood; a plain policy-gradient loop, not TRL);
3. runs one learner round on the online rollouts, with a time budget of `--learner-share` of that
   version's rollout time, and pushes the drafter to the online engine if it was published;
4. pushes the new policy weights to both engines.

It writes `online_drift.md` (per-version table), `online_drift.png` and `online_drift.json` into
`--out`. Acceptance columns: expected acceptance Σ min(p, q) on the version's held-out rollouts of
the drafter that served them (online) and of the frozen initial drafter (shadow); accepted length
and tokens/s are measured by the two engines.

    python examples/online_drift_demo.py --out online_drift_out            # demo models (cached build)
    python examples/online_drift_demo.py --recipe tiny --versions 3        # seconds-long smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.recipe import DemoRecipe
from specroll.demo.reward import score
from specroll.demo.task import Style, make_problems, max_completion_tokens, style_of, to_messages
from specroll.demo.tokenizer import encode_prompt
from specroll.online_drafter import DraftLearner, LearnerConfig
from specroll.rollout import EngineConfig, Rollout, SamplingParams, SpecEngine


@dataclass
class VersionRow:
    policy_version: int
    reward: float
    compact_share: float
    acc_online: float
    acc_frozen: float
    accepted_len_online: float
    accepted_len_frozen: float
    tokens_per_s_online: float
    tokens_per_s_frozen: float
    rollout_s: float
    learner_s: float
    drafter_version: int


def grpo_step(policy, optimizer, rollouts: list[Rollout], rewards: torch.Tensor, group: int) -> None:
    """One policy-gradient step: advantage = reward − group mean (÷ group std), × Σ log π(completion)."""
    grouped = rewards.view(-1, group)  # [P, G]
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()  # [P·G]
    policy.train()
    optimizer.zero_grad()
    total_tokens = sum(len(r.completion_ids) for r in rollouts)
    for r, a in zip(rollouts, adv.tolist()):
        if a == 0.0:
            continue
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        logits = policy(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1]  # [T, V]
        logp = logits.log_softmax(-1).gather(-1, ids[0, len(r.prompt_ids) :, None]).sum()
        (-a * logp / total_tokens).backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    policy.eval()


def timed_generate(engine: SpecEngine, prompts, params, group):
    engine.stats.reset()
    started = time.perf_counter()
    rollouts = engine.generate(prompts, params, n=group)
    return rollouts, time.perf_counter() - started


def run(args: argparse.Namespace) -> list[VersionRow]:
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = DemoRecipe.tiny() if args.recipe == "tiny" else DemoRecipe()
    demo = load_or_build_demo_models(recipe)
    tok = demo.tokenizer
    max_new = max_completion_tokens(recipe.max_digits)
    problems = make_problems(args.prompts * args.versions, seed=args.seed, max_digits=recipe.max_digits)
    policy = copy.deepcopy(demo.target)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.policy_lr)

    def engine(record: bool) -> SpecEngine:
        config = EngineConfig(max_batch_size=args.max_batch, max_seq_len=64 + max_new, gamma=args.gamma,
                              record_signals=record, signal_top_k=16)
        return SpecEngine(copy.deepcopy(demo.target), copy.deepcopy(demo.drafter), config)

    online, frozen = engine(True), engine(False)
    warmup = [encode_prompt(tok, to_messages(problems[0]))]
    for e in (online, frozen):  # first-call costs (allocation, lazy init) stay out of the timings
        e.generate(warmup, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    learner = DraftLearner(demo.drafter, LearnerConfig(lr=args.learner_lr, max_steps=args.learner_max_steps,
                                                       batch_size=16, seed=args.seed))
    rows = []
    for version in range(args.versions):
        batch = problems[version * args.prompts : (version + 1) * args.prompts]
        prompts = [encode_prompt(tok, to_messages(p)) for p in batch]
        params = SamplingParams(max_new_tokens=max_new, temperature=1.0, stop_token_ids=(tok.eos_token_id,),
                                seed=args.seed + version)
        order = (online, frozen) if version % 2 == 0 else (frozen, online)
        timings = {id(e): timed_generate(e, prompts, params, args.group) for e in order}
        rollouts, online_s = timings[id(online)]
        _, frozen_s = timings[id(frozen)]
        online_stats, frozen_stats = copy.deepcopy(online.stats), copy.deepcopy(frozen.stats)
        texts = [tok.decode(r.completion_ids, skip_special_tokens=True) for r in rollouts]
        problem_of = [p for p in batch for _ in range(args.group)]
        rewards = torch.tensor([score(p, t) for p, t in zip(problem_of, texts)])
        compact = sum(style_of(t.rstrip()) is Style.COMPACT for t in texts) / len(texts)
        grpo_step(policy, optimizer, rollouts, rewards, args.group)

        learner.config.time_budget_s = max(args.learner_share * online_s, 1e-3)
        learner.add_rollouts(rollouts)
        report = learner.train_round()
        if report.published:
            online.load_drafter(learner.published_version())
        new_weights = {n: p.detach() for n, p in policy.named_parameters()}
        for e in (online, frozen):
            e.update_target(new_weights, version + 1)
        rows.append(VersionRow(
            policy_version=version, reward=float(rewards.mean()), compact_share=compact,
            acc_online=report.acceptance_before, acc_frozen=report.acceptance_frozen_shadow,
            accepted_len_online=online_stats.mean_accepted_len, accepted_len_frozen=frozen_stats.mean_accepted_len,
            tokens_per_s_online=online_stats.generated_tokens / online_s,
            tokens_per_s_frozen=frozen_stats.generated_tokens / frozen_s,
            rollout_s=online_s, learner_s=report.round_time_s, drafter_version=report.version,
        ))
        print(format_row(rows[-1]), flush=True)
    write_outputs(rows, args, Path(args.out))
    return rows


HEADER = ("| policy v | reward | compact | acc online | acc frozen | acc. len online | acc. len frozen "
          "| tok/s online | tok/s frozen | learner s / rollout s | drafter v |")


def format_row(r: VersionRow) -> str:
    return (f"| {r.policy_version} | {r.reward:.3f} | {r.compact_share:.2f} | {r.acc_online:.3f} | "
            f"{r.acc_frozen:.3f} | {r.accepted_len_online:.2f} | {r.accepted_len_frozen:.2f} | "
            f"{r.tokens_per_s_online:.0f} | {r.tokens_per_s_frozen:.0f} | "
            f"{r.learner_s:.1f} / {r.rollout_s:.1f} ({100 * r.learner_s / r.rollout_s:.0f}%) | {r.drafter_version} |")


def write_outputs(rows: list[VersionRow], args: argparse.Namespace, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    setting = (f"recipe={args.recipe}, {args.prompts} prompts × G={args.group} per version, γ={args.gamma}, "
               f"T=1, policy lr={args.policy_lr}, learner budget={args.learner_share:.0%} of rollout time, "
               f"torch threads={torch.get_num_threads()}, fp32 CPU")
    lines = [f"Online vs frozen drafter under GRPO drift ({setting})", "", HEADER, "|" + "---|" * 11]
    (out / "online_drift.md").write_text("\n".join(lines + [format_row(r) for r in rows]) + "\n")
    (out / "online_drift.json").write_text(json.dumps({"setting": setting, "rows": [asdict(r) for r in rows]},
                                                      indent=2))
    versions = [r.policy_version for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(versions, [r.acc_online for r in rows], "o-", label="online drafter")
    left.plot(versions, [r.acc_frozen for r in rows], "s--", label="frozen drafter (shadow)")
    left.set(xlabel="policy version", ylabel="expected acceptance Σ min(p, q)", title="Acceptance")
    left.legend()
    right.plot(versions, [r.tokens_per_s_online for r in rows], "o-", label="online drafter")
    right.plot(versions, [r.tokens_per_s_frozen for r in rows], "s--", label="frozen drafter")
    right.set(xlabel="policy version", ylabel="rollout tokens/s", title="Rollout throughput")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "online_drift.png", dpi=120)
    print(f"wrote {out / 'online_drift.md'}, {out / 'online_drift.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="full", choices=["full", "tiny"])
    parser.add_argument("--versions", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per policy version")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (GRPO group size G)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--policy-lr", type=float, default=3e-5)
    parser.add_argument("--learner-lr", type=float, default=1e-3)
    parser.add_argument("--learner-max-steps", type=int, default=200)
    parser.add_argument("--learner-share", type=float, default=0.15, help="learner time budget / rollout time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--out", default="online_drift_out")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
