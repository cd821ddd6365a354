"""What one head-learner training step costs at a real vocabulary: the LM head over every position and the whole
vocabulary (what `HeadScorer` did before) against completion positions through a draft vocabulary's rows
(`HeadScorer.scored`), per head kind, on the subword demo target's shape (V = 32,768, H = 512, random init).

A step is the scorer's loss and its backward on one batch of `--batch` sequences (`--prompt` prompt tokens,
`--completion` completion tokens, random features and top-k p) at fp32 on the process's threads, as the learner
runs it; each cell is the median of `--repeats` steps after one warm-up, the paths interleaved. The machine's
load average is printed with the table: time it on a quiet machine.

    python studies/head_step_cost.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specroll.online_drafter.divergence import LOSSES
from specroll.online_drafter.heads.data import FeatureBatch
from specroll.online_drafter.heads.objectives import objective_for
from specroll.online_drafter.heads.scorer import HeadScorer
from specroll.rollout.drafters.eagle3_head import Eagle3Head
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads


def bpe_target_shape() -> LlamaForCausalLM:
    """The subword demo target's shape (`DemoRecipe.bpe().target`, tied 32k head), randomly initialised."""
    from specroll.demo.recipe import DemoRecipe

    recipe = DemoRecipe.bpe()
    shape = recipe.target
    config = LlamaConfig(vocab_size=recipe.vocab_size, hidden_size=shape.hidden_size,
                         num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
                         num_key_value_heads=shape.num_heads, intermediate_size=shape.intermediate_size,
                         max_position_embeddings=2048,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def feature_batch(target, width: int, size: int, prompt: int, completion: int, k: int = 16) -> FeatureBatch:
    g = torch.Generator().manual_seed(0)
    length = prompt + completion
    vocab = target.config.vocab_size
    probs = torch.zeros(size, length, k)
    p = torch.rand(size, completion, k, generator=g)
    probs[:, prompt:] = p / p.sum(-1, keepdim=True) * 0.9
    weights = torch.zeros(size, length)
    weights[:, prompt:] = 1.0 / completion
    return FeatureBatch(torch.randint(1, vocab, (size, length), generator=g),
                        torch.randn(size, length - 1, width, generator=g),
                        torch.randint(0, vocab, (size, length, k), generator=g), probs, weights)


def whole_head_loss(scorer: HeadScorer, head, batch: FeatureBatch) -> torch.Tensor:
    """The loss as the scorer computed it before: log q [B, D, L, V] at every position, restricted after."""
    out = scorer.objective(head, batch, scorer.temperature, scorer.train_depths)
    log_q = scorer.restricted(out.log_q)
    per = torch.stack([LOSSES["tv"](log_q[:, d], batch.topk_ids, batch.topk_probs) for d in range(log_q.shape[1])], 1)
    return (per * batch.weights[:, None]).sum() / (batch.weights.sum() * log_q.shape[1]) + out.aux_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=70)
    parser.add_argument("--completion", type=int, default=300)
    parser.add_argument("--draft-vocab", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = bpe_target_shape()
    hidden = target.config.hidden_size
    heads = {"eagle": EagleHead.for_target(target.config, seed=1), "medusa": MedusaHeads(hidden, 4),
             "eagle3": Eagle3Head.for_target(target.config)}
    subset = torch.arange(args.draft_vocab)
    print(f"V = {target.config.vocab_size}, H = {hidden}; {args.batch} sequences of {args.prompt} + "
          f"{args.completion} tokens; {args.threads} thread(s); load average {os.getloadavg()[0]:.2f}")
    print("| head | whole head, every position, V | scorer, completions, V | scorer, completions, "
          f"N = {args.draft_vocab} | saved |")
    print("|---|---|---|---|---|")
    for kind, head in heads.items():
        width = hidden * (len(head.target_layers) if isinstance(head, Eagle3Head) else 1)
        batch = feature_batch(target, width, args.batch, args.prompt, args.completion)
        scorer = HeadScorer(objective_for(head, target.get_input_embeddings(), target.get_output_embeddings()),
                            1.0, args.batch, 1.0, torch.device("cpu"))
        paths = {"whole": None, "full": None, "subset": subset}  # name: the draft vocabulary
        times: dict[str, list[float]] = {name: [] for name in paths}
        for repeat in range(args.repeats + 1):
            for name, ids in paths.items():
                with scorer.over(ids):
                    head.zero_grad()
                    start = time.perf_counter()
                    loss = whole_head_loss(scorer, head, batch) if name == "whole" else scorer.loss(
                        head, batch, LOSSES["tv"])
                    loss.backward()
                    if repeat:  # the first round warms up
                        times[name].append(time.perf_counter() - start)
        whole, full, sub = (statistics.median(times[name]) for name in paths)
        print(f"| {kind} | {whole:.2f} s | {full:.2f} s | {sub:.2f} s | {whole / sub:.1f}x |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
