"""The drafters that read the policy against plain decoding and the independent drafter, on the demo models.

Contenders (one `SpecEngine` each, γ auto unless `--gamma`): plain decoding, the independent drafter
("model"), layer-skip at k layers, the EAGLE-style head, the Medusa heads, the EAGLE-3 head, the block
(DFlash-style) drafter, the recurrent (ReDrafter) head, and the suffix drafter combined with the model and with a
head; a `<kind>+tree` contender drafts `--tree-width` candidates a level (the recurrent head: its beam search).
The heads: with `--heads DIR`, the `<kind>.pt` files `specroll distill --kind <kind> --out DIR` wrote (each kind its
own folder is fine: `--heads` takes several, comma-separated); without it (character world only) the EAGLE and
Medusa first versions from `demo.heads`, cached. A contender named `<kind>+dv` drafts over the `--draft-vocab` ids
the target's own plain rollouts of other prompts use most (`draft_vocab.top_ids`, as the online learner counts
them) — or, for a head saved with its own (`specroll distill --draft-vocab`), over those, as `specroll train` serves
it. Held-out expected acceptance per kind: `specroll distill --kind <kind>`'s report (the same `--prompts` and
`--seed` sample the same completions and hold out the same groups for every kind).
Two workloads, every contender stepped in lockstep (`grpo_bench.race_repeat`: always the one that has
generated the fewest tokens runs next) so that machine noise hits them alike:

- the grid: batch b ∈ `--batch-sizes` (2b requests through b slots), greedy and T = 1, one epoch;
- the GRPO-shaped workload: P prompts × G = 8 at T = 1 with the stop token, two epochs (history kept).

Printed per contender: tokens/s, the paired ratios to plain and to the model drafter (mean and 95 %
t-interval over the repeats), acceptance and mean accepted length per drafter; and once per drafter its
parameters and draft cost per token (its own `time_drafts` at batch 1 and 16, γ = 4: (catch-up +
3 × further draft) / 4). The machine's load average is printed with every table.

    python studies/head_bench.py --out /tmp/heads.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from specroll.bench.grpo_bench import print_table, race_repeat, summarize
from specroll.bench.models import BenchModels, load_bench_models
from specroll.demo.heads import HeadTrainingSettings, load_or_train_heads, training_prompts
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters import draft_vocab
from specroll.rollout.drafters.registry import DRAFTERS

HEADS = ("eagle", "eagle3", "block", "medusa", "recurrent")
KINDS = {
    "plain": None, "model": ("model",), "layer_skip": ("layer_skip",), "eagle": ("eagle",), "medusa": ("medusa",),
    "eagle3": ("eagle3",), "block": ("block",), "recurrent": ("recurrent",),
    "suffix+model": ("suffix", "model"), "suffix+eagle": ("suffix", "eagle"), "suffix+eagle3": ("suffix", "eagle3"),
    "suffix+block": ("suffix", "block"), "suffix+recurrent": ("suffix", "recurrent"),
}
DV = "+dv"  # a contender's suffix: the same drafter over the draft vocabulary
TREE = "+tree"  # a contender's suffix: the same drafter drafting `--tree-width` candidates a level
DV_KINDS = ("model", "eagle", "eagle3", "medusa", "block", "recurrent")  # those with an LM head to cut
TREE_KINDS = {name: drafters is not None and all(DRAFTERS[k].trees for k in drafters)  # those that draft trees
              for name, drafters in KINDS.items()}
COUNT_PROMPTS = 64  # prompts, never raced, whose plain rollouts choose the +dv contenders' ids


def drafters_of(name: str) -> tuple[str, ...] | None:
    """`name`'s drafters (None: plain); ValueError for a name this benchmark does not know."""
    base = name.removesuffix(TREE) if name.endswith(TREE) else name.removesuffix(DV)
    trees = name.endswith(TREE) and TREE_KINDS.get(base)
    if base not in KINDS or (name.endswith(DV) and base not in DV_KINDS) or (name.endswith(TREE) and not trees):
        raise ValueError(f"contender {name!r} is invalid: one of {list(KINDS)}, or {list(DV_KINDS)} with {DV!r}, or "
                         f"{[k for k, trees in TREE_KINDS.items() if trees]} with {TREE!r}")
    return KINDS[base]


class Contenders:
    def __init__(self, models: BenchModels, heads: dict[str, torch.nn.Module], layer_skip_layers: int,
                 gamma: int | str, draft_ids: torch.Tensor | None = None, tree_width: int = 3):
        self.models, self.heads, self.layers, self.gamma = models, heads, layer_skip_layers, gamma
        self.draft_ids, self.tree_width = draft_ids, tree_width

    def build(self, kind: str, slots: int, max_seq_len: int) -> SpecEngine:
        drafters = drafters_of(kind)
        gamma = 0 if drafters is None else self.gamma
        config = EngineConfig(max_batch_size=slots, max_seq_len=max_seq_len, gamma=gamma, drafters=drafters,
                              layer_skip_layers=self.layers, stats_trace_steps=1,
                              tree_width=self.tree_width if kind.endswith(TREE) else 1)
        weights = None
        if drafters and "model" in drafters:
            weights = self.models.drafter
        elif drafters:
            weights = next((self.heads[k] for k in HEADS if k in drafters), None)
        engine = SpecEngine(self.models.target, weights, config)
        if kind.endswith(DV):  # a head trained over its own ids (distill --draft-vocab) drafts over them, as served
            carried = getattr(weights, draft_vocab.CARRIED_ATTR, None)
            engine.set_draft_vocab(draft_vocab.DraftVocab(self.draft_ids if carried is None else carried,
                                                          engine.vocab_size))
        return engine


def head_kinds(contenders: list[str]) -> list[str]:
    """The head kinds the contenders draft with."""
    return sorted({k for name in contenders for k in (drafters_of(name) or ()) if k in HEADS})


def load_heads(models: BenchModels, folders: list[str], kinds: list[str]) -> dict[str, torch.nn.Module]:
    """Each head kind of `kinds` from the first of `folders` holding its `<kind>.pt` (what `specroll distill`
    writes), shaped after the target as `specroll train` shapes it (`models.head`)."""
    from pathlib import Path

    from specroll.integrations.model_source import ModelPaths, load_drafter

    heads = {}
    for kind in kinds:
        path = next((Path(f) / f"{kind}.pt" for f in folders if (Path(f) / f"{kind}.pt").is_file()), None)
        if path is None:
            raise SystemExit(f"--heads: no {kind}.pt in {folders} (specroll distill --kind {kind} writes one)")
        # the target folder serves only a checkpoint folder's tokenizer check: these are state dicts
        paths = ModelPaths(target=str(models.path / "target") if models.path else "(in memory)", head=str(path))
        heads[kind] = load_drafter(paths, EngineConfig(drafters=(kind,)), models.target)
        print(f"  {kind}: {path}", flush=True)
    return heads


def rollout_ids(models: BenchModels, prompts: list[list[int]], size: int, max_new_tokens: int) -> torch.Tensor:
    """The `size` ids the target's plain T = 1 rollouts of `prompts` (ones the benchmark does not race on) use
    most, the stop ids always in (`specroll distill`'s count)."""
    from specroll.jobs.distill_data import draft_ids

    engine = SpecEngine(models.target, None, EngineConfig(max_batch_size=32, max_seq_len=512, gamma=0))
    done = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=1,
                                                   stop_token_ids=models.stop_token_ids))
    return draft_ids(done, size, engine.vocab_size, models.stop_token_ids)


def race(contenders: Contenders, kinds: list[str], prompts: list[list[int]], params: list[SamplingParams],
         slots: int, repeats: int, header: str) -> dict:
    max_seq = max(map(len, prompts)) + max(p.max_new_tokens for p in params) + 1
    calibrated = contenders.build("model", slots, max_seq)
    cost = calibrated.gamma_policy.cost
    for kind in kinds:  # warm-up, untimed
        contenders.build(kind, slots, max_seq).generate(prompts[:1], SamplingParams(max_new_tokens=4, seed=0))
    per_repeat: dict[str, list] = {k: [] for k in kinds}
    for rep in range(repeats):
        engines = {k: contenders.build(k, slots, max_seq) for k in kinds}
        rep_params = [SamplingParams(**{**p.__dict__, "seed": 1000 * rep + i}) for i, p in enumerate(params)]
        for name, tally in race_repeat(engines, prompts, rep_params, cost).items():
            per_repeat[name].append(tally)
    load = os.getloadavg()
    result = {"header": f"{header}; {repeats} repeats in lockstep; load average {load[0]:.2f} {load[1]:.2f} "
                        f"{load[2]:.2f}", "contenders": summarize(per_repeat)}
    print(f"\n{result['header']}", flush=True)
    print_table(result)
    return result


def draft_costs(contenders: Contenders, kinds: list[str]) -> dict[str, dict]:
    """Per drafter: parameters and ms per draft token at batch 1 and 16 (γ = 4), from its own timing."""
    out = {}
    for kind in kinds:
        drafters = drafters_of(kind)
        if drafters is None or len(drafters) > 1:
            continue
        engine = contenders.build(kind, 16, 192)
        times = engine.drafter.time_drafts([1, 16], time.perf_counter() + 10)
        per_token = {b: 1000 * (row[1] + 3 * row[0]) / 4 for b, row in zip(times.batch_sizes, times.times)}
        params = contenders.models.drafter if drafters[0] == "model" else contenders.heads.get(drafters[0])
        out[kind] = {"parameters": sum(p.numel() for p in params.parameters()) if params is not None else 0,
                     "ms_per_draft_token_b1": per_token[1], "ms_per_draft_token_b16": per_token[16]}
        print(f"  {kind}: {out[kind]['parameters'] / 1e6:.2f}M parameters, {per_token[1]:.2f} ms/draft token at "
              f"batch 1, {per_token[16]:.2f} at batch 16", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contenders", default="plain,model,layer_skip,eagle,medusa,suffix+model,suffix+eagle")
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--modes", default="greedy,sampled")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--grpo-prompts", type=int, default=16)
    parser.add_argument("--grpo-slots", type=int, default=32)
    parser.add_argument("--grpo-repeats", type=int, default=2)
    parser.add_argument("--layer-skip-layers", type=int, default=4)
    parser.add_argument("--gamma", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", choices=("demo", "demo-bpe", "tiny"), default="demo")
    parser.add_argument("--heads", default=None, help="comma-separated folders with `specroll distill`'s <kind>.pt")
    parser.add_argument("--draft-vocab", type=int, default=2048, help="N of the `<kind>+dv` contenders")
    parser.add_argument("--tree-width", type=int, default=3, help="candidates a level of the `<kind>+tree` contenders")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kinds = args.contenders.split(",")
    try:
        for kind in kinds:
            drafters_of(kind)
    except ValueError as e:
        raise SystemExit(f"--contenders: {e}") from None
    raced = max(64, args.grpo_prompts)
    models = load_bench_models(args.models, raced + COUNT_PROMPTS)  # the last ones only count the draft ids
    wanted = head_kinds(kinds)
    if args.heads:
        heads = load_heads(models, args.heads.split(","), wanted)
    elif args.models == "demo":
        from specroll.demo.model_cache import load_or_build_demo_models, models_dir

        settings = HeadTrainingSettings()
        prompts = training_prompts(load_or_build_demo_models().tokenizer, settings.prompts)
        heads = load_or_train_heads(models.target, prompts, models.stop_token_ids, models_dir(), settings)
    else:
        heads = {}
    missing = sorted(set(wanted) - set(heads))
    if missing:
        raise SystemExit(f"--heads: no trained {missing} for --models {args.models} (specroll distill writes them)")
    draft_ids = None
    if any(k.endswith(DV) for k in kinds):
        draft_ids = rollout_ids(models, models.prompts[raced:], args.draft_vocab, args.max_new_tokens)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    contenders = Contenders(models, heads, args.layer_skip_layers, gamma, draft_ids, args.tree_width)
    print(f"{models.description}; layer-skip at {args.layer_skip_layers} of "
          f"{models.target.config.num_hidden_layers} layers; gamma={gamma}; draft vocabulary {args.draft_vocab} "
          f"ids for the {DV} contenders", flush=True)
    results: dict = {"draft_costs": draft_costs(contenders, kinds), "grid": [], "grpo": None}
    for batch in (int(b) for b in args.batch_sizes.split(",") if b):  # "": the GRPO-shaped workload only
        for mode in args.modes.split(","):
            params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0 if mode == "greedy" else 1.0,
                                    stop_token_ids=models.stop_token_ids)
            results["grid"].append(race(contenders, kinds, models.prompts[: 2 * batch], [params], batch, args.repeats,
                                        f"grid: batch {batch}, {mode}, {2 * batch} requests, "
                                        f"max_new_tokens={args.max_new_tokens}"))
    if args.grpo_prompts:
        base = models.prompts[: args.grpo_prompts]
        prompts = [p for p in base for _ in range(8)]
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0,
                                stop_token_ids=models.stop_token_ids)
        results["grpo"] = race(contenders, kinds, prompts, [params, params], args.grpo_slots, args.grpo_repeats,
                               f"GRPO-shaped: {len(base)} prompts × G=8 at T=1, 2 epochs, slots={args.grpo_slots}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
