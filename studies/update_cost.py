"""The policy update with and without length grouping (`trl_hook.length_groups`), in a real TRL GRPOTrainer.

    python studies/update_cost.py [--repeats 4] [--steps 3] [--threads 1]

On the subword demo world (the main job's): the target's own plain T = 1 rollouts of `--prompts` prompts × G
(`--generations`) with the stop token, up to `--max-new-tokens` (the main job's step-0 completions, long-tailed),
are what a fixed `rollout_func` returns at every step; `GRPOTrainer` and `length_grouped(GRPOTrainer)` (a fresh
copy of the policy each) train `--steps` steps on them. The two arms alternate, the order swapped every repeat;
the per-repeat ratio is TRL's own `step_time` (forward, backward, optimizer) of plain over grouped, median over
the steps after the first. Printed: the completions' lengths, the token-rows each arm's forwards run (TRL pads
to the step's longest completion) and the paired speed-up (mean, 95% t-interval), with the load average.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch

from specroll.bench.engine_race import paired_ratio


def sample_completions(models, tokenizer, prompts, generations: int, max_new_tokens: int) -> list[list[list[int]]]:
    """The target's plain T = 1 completions, `generations` per prompt."""
    from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

    engine = SpecEngine(models.target, None, EngineConfig(max_batch_size=len(prompts) * generations,
                                                          max_seq_len=max(map(len, prompts)) + max_new_tokens + 1,
                                                          gamma=0))
    done = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0,
                                                   stop_token_ids=models.stop_token_ids), n=generations)
    return [[r.completion_ids for r in done[i * generations:(i + 1) * generations]] for i in range(len(prompts))]


def fixed_rollout(prompt_ids: list[list[int]], completions: list[list[list[int]]], keys: list[str]):
    """TRL's `rollout_func` returning, for the k-th occurrence of a prompt in a call, its k-th completion."""

    def rollout(prompts, trainer):
        seen: dict[str, int] = {}
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt in prompts:
            key = json.dumps(prompt)
            index, k = keys.index(key), seen.get(key, 0)
            seen[key] = k + 1
            out["prompt_ids"].append(prompt_ids[index])
            out["completion_ids"].append(completions[index][k])
            out["logprobs"].append([0.0] * len(completions[index][k]))
        return out

    return rollout


def step_times(trainer_class, policy, tokenizer, messages, rollout, args, out_dir: str) -> list[float]:
    from datasets import Dataset
    from trl import GRPOConfig

    config = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=len(messages) * args.generations,
                        num_generations=args.generations, max_completion_length=args.max_new_tokens,
                        max_steps=args.steps, learning_rate=1e-5, logging_steps=1, report_to="none", use_cpu=True,
                        save_strategy="no", seed=0, beta=0.0, gradient_checkpointing=False, disable_tqdm=True)

    def reward(prompts, completions, **kwargs):  # any reward that varies within a group: advantages are nonzero
        return [float(len(c[0]["content"]) % 7) for c in completions]

    trainer = trainer_class(model=copy.deepcopy(policy), reward_funcs=reward, args=config,
                            train_dataset=Dataset.from_dict({"prompt": messages}), processing_class=tokenizer,
                            rollout_func=rollout)
    trainer.train()
    return [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=320)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    from specroll.bench.models import load_bench_models
    from specroll.integrations.trl_hook import length_grouped
    from specroll.integrations.trl_hook.length_groups import length_groups

    models = load_bench_models("demo-bpe", args.prompts)
    tokenizer, messages = _tokenizer_and_messages(args.prompts)
    completions = sample_completions(models, tokenizer, models.prompts, args.generations, args.max_new_tokens)
    lengths = sorted((len(c) for group in completions for c in group), reverse=True)
    prompt = max(map(len, models.prompts))
    rows = [prompt + w for w in lengths]
    grouped = sum(len(g) * (prompt + lengths[g[0]]) for g in length_groups(lengths, prompt))
    print(f"{models.description}; {len(lengths)} completions: mean {statistics.mean(lengths):.0f}, median "
          f"{statistics.median(lengths):.0f}, max {lengths[0]} tokens; token-rows a forward runs: padded "
          f"{len(lengths) * rows[0]}, grouped {grouped}, real {sum(rows)}", flush=True)
    rollout = fixed_rollout(models.prompts, completions, [json.dumps(m) for m in messages])
    arms = {"TRL": GRPOTrainer, "length-grouped": length_grouped(GRPOTrainer)}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for rep in range(args.repeats):
        for name in (list(arms) if rep % 2 == 0 else list(arms)[::-1]):
            start = time.perf_counter()
            measured = step_times(arms[name], models.target, tokenizer, messages, rollout, args,
                                  f"/tmp/update_cost_{name}")
            times[name].append(statistics.median(measured[1:] or measured))
            print(f"  repeat {rep} {name}: step {times[name][-1]:.2f} s ({time.perf_counter() - start:.0f} s with "
                  "setup)", flush=True)
    speedup = paired_ratio(times["TRL"], times["length-grouped"])
    load = os.getloadavg()
    print(f"update step: TRL {statistics.median(times['TRL']):.2f} s, length-grouped "
          f"{statistics.median(times['length-grouped']):.2f} s; speed-up {speedup['mean']:.2f}x "
          f"[{speedup['lo']:.2f}, {speedup['hi']:.2f}] ({args.repeats} paired repeats); load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    result = {"lengths": lengths, "prompt_tokens": prompt, "token_rows": {"padded": len(lengths) * rows[0],
              "grouped": grouped, "real": sum(rows)}, "step_s": times, "speedup": speedup, "load": load}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _tokenizer_and_messages(count: int):
    """The subword demo's tokenizer and the chat messages of `load_bench_models("demo-bpe", count)`'s prompts."""
    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.recipe import DemoRecipe
    from specroll.demo.world import task_for

    demo = load_or_build_demo_models(DemoRecipe.bpe())
    return demo.tokenizer, task_for(demo.recipe.world).make_prompts(count, seed=0, max_digits=demo.recipe.max_digits)


if __name__ == "__main__":
    main()
