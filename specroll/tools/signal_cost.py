"""What the online learner's signals cost per GRPO step, by source (`learner.signals`), on the demo models.

    python -m specroll.tools.signal_cost [--models demo] [--prompts 8] [--generations 8] [--max-new-tokens 128]
                                         [--repeats 5] [--top-k 16] [--eagle3]

vLLM records no per-position distributions, so the learner's signals cost something on it; this measures what.
On the same rollouts (the target's own samples of the task's prompts at T = 1, P prompts × G siblings, stopping at
EOS), each repeat times, interleaved (the order rotates per repeat):

- `loss`: the GRPO loss's forward and backward over the rollouts as TRL 1.16 runs them (its fused LM head,
  `trl.trainer.utils.add_fused_lm_head`; prompts left-padded, completions right-padded; `--micro-batch` rows per
  forward) — what a training step costs anyway;
- `loss+capture`: the same with `TrainerSignalCapture` watching (`learner.signals: trainer`);
- `target_forward`: `TargetSignals.record` over the rollouts (`learner.signals: forward`: one extra forward of a
  policy copy).

It prints the medians and the two costs side by side: the capture's overhead (`loss+capture` − `loss`) and the extra
forward, each as seconds per step and as a share of `loss`. `--eagle3` records the hidden states an EAGLE-3 head
reads too (the target's default low / middle / high layers). Run it on a quiet machine: timings, not assertions.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from specroll.bench.models import load_bench_models
from specroll.integrations.signal_source import SignalRequest
from specroll.integrations.trl_hook.signal_capture import TrainerSignalCapture
from specroll.integrations.vllm.signals import TargetSignals
from specroll.rollout import EngineConfig, Rollout, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads.eagle3 import default_layers

CONTENDERS = ("loss", "loss+capture", "target_forward")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specroll.tools.signal_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="demo", help="demo, demo-bpe or tiny (a smoke run, not a measurement)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8, help="G: samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per loss forward (TRL's per-device batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top-k", type=int, default=16, help="engine.signal_top_k")
    parser.add_argument("--eagle3", action="store_true", help="record an EAGLE-3 head's hidden states too")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def sample_rollouts(models, args: argparse.Namespace, params: SamplingParams) -> list[Rollout]:
    longest = max(map(len, models.prompts)) + args.max_new_tokens
    engine = SpecEngine(models.target, None, EngineConfig(max_batch_size=64, max_seq_len=longest, gamma=0))
    return engine.generate(models.prompts, params, n=args.generations)


def grpo_rows(rollouts: list[Rollout], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """input_ids and attention_mask [N, P + C] as TRL's loss builds them, and P (the prompt columns)."""
    width, length = max(len(r.prompt_ids) for r in rollouts), max(len(r.completion_ids) for r in rollouts)
    ids = torch.full((len(rollouts), width + length), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, r in enumerate(rollouts):
        ids[row, width - len(r.prompt_ids):width] = torch.tensor(r.prompt_ids)
        ids[row, width:width + len(r.completion_ids)] = torch.tensor(r.completion_ids)
        mask[row, width - len(r.prompt_ids):width + len(r.completion_ids)] = 1
    return ids, mask, width


def loss_step(policy: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, width: int, micro_batch: int,
              capture: TrainerSignalCapture | None) -> None:
    """The loss's forward and backward over every row, `micro_batch` rows a forward (watched by `capture` if given)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :width] = -100
    for start in range(0, ids.shape[0], micro_batch):
        rows = slice(start, start + micro_batch)
        if capture is None:
            out = policy(input_ids=ids[rows], attention_mask=mask[rows], labels=labels[rows], fused_lm_head=True)
        else:
            with capture.watching(policy, width):
                out = policy(input_ids=ids[rows], attention_mask=mask[rows], labels=labels[rows], fused_lm_head=True)
        out.log_probs.sum().backward()
    policy.zero_grad(set_to_none=True)


def timed(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, float]:
    from trl.trainer.utils import add_fused_lm_head

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    models = load_bench_models(args.models, args.prompts, args.seed)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, stop_token_ids=models.stop_token_ids,
                            seed=args.seed)
    rollouts = sample_rollouts(models, args, params)
    layers = default_layers(models.target.config.get_text_config().num_hidden_layers) if args.eagle3 else None
    request = SignalRequest(args.top_k, hidden=args.eagle3, capture_layers=layers)
    policy = copy.deepcopy(models.target).train()
    add_fused_lm_head(policy, temperature=params.temperature, outputs=("log_probs", "entropy"))
    ids, mask, width = grpo_rows(rollouts, models.pad_id)
    forward = TargetSignals(models.target.eval(), request.top_k, request.hidden, request.capture_layers)
    capture = TrainerSignalCapture(request)

    def with_capture() -> None:
        capture.expect(rollouts, params, 0)
        loss_step(policy, ids, mask, width, args.micro_batch, capture)
        capture.take()

    runs = {"loss": lambda: loss_step(policy, ids, mask, width, args.micro_batch, None), "loss+capture": with_capture,
            "target_forward": lambda: forward.record([copy.copy(r) for r in rollouts], params)}
    seconds: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for repeat in range(args.repeats + 1):  # the first round warms up, untimed
        order = CONTENDERS[repeat % 3:] + CONTENDERS[:repeat % 3]
        for name in order:
            took = timed(runs[name])
            if repeat:
                seconds[name].append(took)
    if capture.missed:  # the capture must have seen every rollout, or its overhead is not the whole one
        raise RuntimeError(f"the capture missed {capture.missed} rollouts: its timing does not cover them")
    median = {name: statistics.median(values) for name, values in seconds.items()}
    result = {**median, "capture_overhead": median["loss+capture"] - median["loss"]}
    tokens = sum(len(r.completion_ids) for r in rollouts)
    print(f"signal cost per GRPO step: {models.description}; {len(rollouts)} rollouts ({args.prompts} prompts x "
          f"{args.generations}), {tokens} completion tokens, top-{args.top_k}"
          f"{f', EAGLE-3 layers {list(layers)}' if layers else ''}; median of {args.repeats} interleaved repeats")
    for name in CONTENDERS:
        print(f"  {name:<16} {median[name]:8.3f} s")
    for name, cost in (("trainer (capture)", result["capture_overhead"]), ("forward", median["target_forward"])):
        print(f"  learner.signals: {name:<18} {cost:8.3f} s/step = {cost / median['loss']:6.1%} of the loss step")
    return result


if __name__ == "__main__":
    main()
