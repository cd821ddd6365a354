"""`specroll distill`: a drafter for your policy in one command, trained as the online learner trains it.

    specroll distill --policy my_policy/ --prompts my_task:prompts --kind eagle --minutes 10 --out my_drafter/

1. checks the inputs (the policy's tokenizer, every prompt fits the context with `--max-new-tokens`, a `--drafter`
   LM shares the tokenizer: each mistake one line, `distill_data`);
2. samples the policy's own completions with the engine — plain decoding at the sampling settings given
   (`--temperature`, `--top-k`, `--top-p`), recording the policy's top-k p (and, for a head, its hidden states)
   exactly as verification records them online — in chunks saved under `<out>/samples/`;
3. trains the drafter (`--kind eagle|eagle3|medusa|block`: a fresh head on the policy's features — EAGLE-3's and the
   block drafter's fused from several of its layers, `engine.eagle3_layers` / `engine.block_layers`' defaults;
   `model`: a smaller LM of
   the same tokenizer, `--drafter`, or the policy's own first `--layers` layers) with the online learner itself
   (`online_drafter.make_online_learner`: its loss, its held-out set — every 4th prompt group — and its
   publish-if-better gate), in rounds over the `--minutes` budget (`online_drafter.offline`, the demo heads'
   recipe too): two phases, `--lr` for two thirds, then `--final-lr`, each phase a learner on the same samples
   (the same held-out groups); the budget counts whole rounds, gates included (a gate that overran its round is
   taken from the next ones);
4. writes what `models:` reads — `<out>/<kind>.pt` (a head's state dict: `models.head`) or `<out>/drafter/` (a
   `save_pretrained` LM: `models.drafter`); an EAGLE-3 or DFlash head also in `<out>/drafter/`, the speculators
   layout vLLM serves (and DFlash in z-lab's, `<out>/drafter_zlab/`: `integrations.drafter_export`) — and
   `<out>/report.md`: held-out expected acceptance per round and the speed the calibrated cost model predicts against
   plain decoding at live batch 1 / 16 / 64 (`distill_report`).

An interrupted run resumes from `<out>`: the sample chunks written, the learner's state after its last round
(`<out>/learner.pt`) and the rounds so far; `distill.json` holds the settings that decide what is learnt, and a
different one in the same folder is refused. `--minutes` may grow on a resume (more rounds).

Only argparse is imported at module level: `specroll distill --help` answers before torch loads.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

KINDS = ("eagle", "eagle3", "medusa", "block", "model")
# the arguments that decide what is learnt: a resumed run must have the same
SETTINGS = ("policy", "prompts", "kind", "tokenizer", "drafter", "layers", "num_prompts", "samples", "max_new_tokens",
            "temperature", "top_k", "top_p", "seed", "lr", "final_lr", "batch_size", "eagle_intermediate_size",
            "medusa_heads", "block_size", "round_minutes", "draft_vocab")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="the policy: a save_pretrained folder")
    parser.add_argument("--prompts", required=True, help="a .jsonl (rows with 'prompt'), .json or text file, or a "
                        "dotted dataset(count, seed) function as task.dataset in a train config")
    parser.add_argument("--kind", choices=KINDS, default="eagle", help="the drafter to train (default: eagle)")
    parser.add_argument("--out", required=True, help="the folder to write (and resume from)")
    parser.add_argument("--tokenizer", default=None, help="the policy's tokenizer folder (default: the policy's)")
    parser.add_argument("--drafter", default=None, help="--kind model: a smaller LM of the same tokenizer")
    parser.add_argument("--layers", type=int, default=None, help="--kind model without --drafter: keep the policy's "
                        "first N layers (default: a quarter of them)")
    parser.add_argument("--num-prompts", type=int, default=768)
    parser.add_argument("--samples", type=int, default=8, help="completions sampled per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget (sampling apart)")
    parser.add_argument("--round-minutes", type=float, default=100 / 60, help="training between two gates")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--final-lr", type=float, default=2e-4, help="the last third's (= --lr: one phase)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eagle-intermediate-size", type=int, default=None, help="the EAGLE head's MLP width "
                        "(default: the policy's)")
    parser.add_argument("--medusa-heads", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=8, help="--kind block: the block (anchor and k - 1 drafts; "
                        "default 8, engine.block_size's)")
    parser.add_argument("--draft-vocab", type=int, default=None, help="a head: train it over the N ids the samples "
                        "use most (and the stop ids), saved with it; serve it with engine.draft_vocab: N (default: "
                        "the whole vocabulary)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="the context (default: the policy's)")
    parser.add_argument("--batch-rows", type=int, default=32, help="rows the sampling engine decodes together")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--cost-model-s", type=float, default=8.0, help="seconds to calibrate the cost model")


def run(args: argparse.Namespace) -> int:
    from specroll.integrations.yaml_config import ConfigError

    _check_arguments(args, ConfigError)
    import torch
    from transformers import AutoModelForCausalLM

    from specroll.online_drafter.offline import OfflineSchedule, train_offline

    from . import distill_data as data

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    tokenizer = data.policy_tokenizer(args.policy, args.tokenizer)
    try:
        policy = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32).eval()
    except (OSError, ValueError) as err:
        raise ConfigError(f"--policy={args.policy!r} is invalid: not a save_pretrained model folder ({err})") from err
    text = policy.config.get_text_config()
    if args.kind == "model" and not args.drafter and args.layers is None:
        args.layers = max(1, text.num_hidden_layers // 4)
    context = args.max_seq_len or int(getattr(text, "max_position_embeddings", 0) or 0)
    prompt_ids = data.tokenize(data.load_prompts(args.prompts, args.num_prompts), tokenizer, context,
                               args.max_new_tokens)
    _check_out(out, args, ConfigError)
    drafter = data.fresh_drafter(args.kind, policy, args, tokenizer)  # before an engine lays the policy out anew
    stop_ids = tuple(i for i in [tokenizer.eos_token_id] if i is not None)
    if args.draft_vocab is not None and args.draft_vocab > text.vocab_size:
        raise ConfigError(f"--draft-vocab={args.draft_vocab} is invalid: an int in [1, {text.vocab_size}] (the "
                          "policy's vocabulary)")
    entries = data.sample(policy, prompt_ids, args.kind, args, stop_ids, out / "samples", drafter)
    ids = None if args.draft_vocab is None else data.draft_ids(entries, args.draft_vocab, text.vocab_size, stop_ids)
    schedule = OfflineSchedule(budget_s=args.minutes * 60, round_s=args.round_minutes * 60, lr=args.lr,
                               final_lr=args.final_lr, batch_size=args.batch_size, temperature=args.temperature,
                               device=args.device)
    trained = train_offline(drafter, policy, entries, schedule, sum(map(data.num_positions, entries)),
                            out / "learner.pt", ids, f"training the {args.kind} drafter")
    return finish(drafter, policy, tokenizer, args, out, trained.rounds, trained.acceptance, len(prompt_ids), entries,
                  ids)


def finish(drafter: Any, policy: Any, tokenizer: Any, args: argparse.Namespace, out: Path,
           rounds: list[dict[str, Any]], final: float, num_prompts: int, entries: list[Any], ids: Any = None) -> int:
    """Write the drafter where `models:` reads it (a head with its draft vocabulary `ids`, if any), predict its
    speed, write the report; print where they are."""
    import torch

    from specroll.integrations.drafter_export import export_drafter
    from specroll.online_drafter.heads.data import FeatureSequence
    from specroll.rollout.drafters.draft_vocab import STATE_KEY, carry

    from .distill_data import num_positions
    from .distill_report import predict_speed, write_report

    if args.kind == "model":
        output = out / "drafter"
        export_drafter(drafter, "model", policy, output, tokenizer)
        models_yaml = (f"models: {{source: pretrained, target: {args.policy}, drafter: {output}}}\n"
                       "engine: {drafters: [model]}\n")
    else:
        output = out / f"{args.kind}.pt"
        torch.save({**drafter.state_dict(), **({} if ids is None else {STATE_KEY: ids})}, output)
        carry(drafter, ids)  # the speed prediction's engine drafts over them
        if args.kind in ("eagle3", "block"):  # also in the public layout vLLM serves (speculators'; z-lab's too)
            verifier = str(Path(args.policy).resolve())
            public = export_drafter(drafter, args.kind, policy, out / "drafter", verifier=verifier)
            layouts = ", ".join(f"{name}: {path}" for name, path in public.layouts.items())
            logger.info(f"specroll distill: the {args.kind} drafter also in {layouts}")
        extra = {"medusa": f", medusa_heads: {args.medusa_heads}", "block": f", block_size: {args.block_size}"}.get(
            args.kind, "") + ("" if ids is None else f", draft_vocab: {args.draft_vocab}")
        models_yaml = (f"models: {{source: pretrained, target: {args.policy}, head: {output}}}\n"
                       f"engine: {{drafters: [{args.kind}]{extra}}}\n")
    logger.info(f"specroll distill: calibrating the engine's cost model (~{args.cost_model_s:g}s) to predict the speed")
    spans = [(len(e.token_ids), e.num_positions) if isinstance(e, FeatureSequence)
             else (len(e.prompt_ids) + len(e.completion_ids), len(e.completion_ids)) for e in entries]
    halfway = round(sum(total - completion / 2 for total, completion in spans) / len(spans))  # a mean row's KV mid-way
    predictions = predict_speed(policy, drafter, args.kind, final, max_gamma=6, device=args.device,
                                budget_s=args.cost_model_s, cache=str(out / "calibration"),
                                max_seq_len=max(total for total, _ in spans) + 8, context=halfway,
                                draft_vocab=args.draft_vocab)
    settings = {**{name: getattr(args, name) for name in SETTINGS}, "minutes": args.minutes,
                "num_prompts": num_prompts, "num_sequences": len(entries),
                "num_positions": sum(map(num_positions, entries)), "context": halfway}
    report = write_report(out / "report.md", settings, rounds, predictions, str(output), models_yaml)
    (out / "rounds.json").write_text(json.dumps(rounds, indent=1))
    speeds = ", ".join(f"{p.speedup:.2f}x at batch {p.batch}" for p in predictions)
    logger.info(f"specroll distill: held-out expected acceptance {final:.4f}; predicted {speeds}; drafter: {output}; "
          f"report: {report}")
    return 0


def _check_arguments(args: argparse.Namespace, error: type[Exception]) -> None:
    if args.kind != "model" and (args.drafter or args.layers is not None):
        raise error(f"--kind={args.kind} is invalid with --drafter / --layers: those make a drafter LM (--kind model)")
    if args.drafter and args.layers is not None:
        raise error("--layers is invalid with --drafter: the drafter LM is either yours or cut from the policy")
    for name in ("num_prompts", "samples", "max_new_tokens", "batch_size", "batch_rows", "medusa_heads"):
        if getattr(args, name) < 1:
            raise error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: an int >= 1")
    if args.draft_vocab is not None and (args.kind == "model" or args.draft_vocab < 1):
        raise error(f"--draft-vocab={args.draft_vocab} is invalid with --kind={args.kind}: an int >= 1, for a head "
                    "(a drafter LM's subset is set when it is served: engine.draft_vocab)")
    if args.block_size < 2:
        raise error(f"--block-size={args.block_size} is invalid: an int >= 2 (the anchor and at least one draft)")
    for name in ("minutes", "round_minutes", "temperature", "lr", "final_lr"):
        if not getattr(args, name) > 0:
            raise error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: a number > 0")


def _check_out(out: Path, args: argparse.Namespace, error: type[Exception]) -> None:
    """`<out>/distill.json` names the settings of the run in `out`: the same ones resume it, others are refused."""
    settings = {name: getattr(args, name) for name in SETTINGS}
    settings["policy"] = str(Path(args.policy).resolve())
    path = out / "distill.json"
    if path.is_file():
        before = json.loads(path.read_text())
        changed = sorted(k for k in settings if k in before and before[k] != settings[k])  # a setting added since:
        # its default then
        if changed:
            raise error(f"--out={str(out)!r} is invalid: it holds a run with other {', '.join(changed)} "
                        f"({', '.join(f'{k}={before.get(k)!r}' for k in changed)}): resume it as it was, or use "
                        "another folder")
        logger.info(f"specroll distill: resuming the run in {out}")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=1))
