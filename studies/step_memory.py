"""Peak memory of one sampled engine step at a real vocabulary (#35: V = 151,936, B = 64, γ = 4).

At a real vocabulary the step's [B, γ+1, V] tensors — logits, p, the Gumbel noise, the drafter's q — are the
memory that decides the batch a GPU fits, not the small models. This measures the high-water mark of the
bytes held by tensors the step creates (`LiveBytes`, a dispatch mode that sees every op's outputs and when
their storages die), for one steady-state step of a model drafter (dense q, or over a draft vocabulary) and
of the suffix drafter (point masses), under both accept rules. The models are tiny (hidden 64, one layer)
so that what is measured is the sampling path, not weights: on a GPU `torch.cuda.max_memory_allocated`
would say the same of a real model's step minus its weights and activations.

    python studies/step_memory.py [--vocab 151936 --batch 64 --gamma 4]

It runs against whatever `specroll` imports: point PYTHONPATH at an older checkout to measure "before".
"""

from __future__ import annotations

import argparse
import json
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.config import SuffixConfig


class LiveBytes(TorchDispatchMode):
    """Tracks the bytes of every storage an op creates while the mode is on, and their high-water mark.

    A storage is counted once (views share it) and released when the last tensor the mode saw on it dies.
    Temporaries inside one kernel are not seen; every tensor a Python-level op returns is."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage data_ptr -> [tensors alive on it, its bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in _tensors(out):
            self._track(tensor)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0:
            return
        if ptr not in self._refs:
            self._refs[ptr] = [0, storage.nbytes()]
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self._refs[ptr][0] += 1
        weakref.finalize(tensor, self._release, ptr)

    def _release(self, ptr: int) -> None:
        entry = self._refs.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= self._refs.pop(ptr)[1]

    @property
    def peak_mib(self) -> float:
        return self.peak / 2**20


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _tensors(item)]
    return []


def tiny_lm(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def measure(vocab: int, batch: int, gamma: int, drafter: str, sampler: str, draft_vocab: int | None) -> float:
    """MiB: the high-water mark of tensor bytes created during one steady-state sampled step."""
    target = tiny_lm(vocab, 0)
    kwargs = dict(max_batch_size=batch, max_seq_len=64, gamma=gamma, sampler=sampler)
    if drafter == "suffix":
        kwargs["drafters"] = ("suffix",)
        kwargs["suffix"] = SuffixConfig(min_survival=0.0)  # proposes every match: a step with drafts
        engine = SpecEngine(target, None, EngineConfig(**kwargs))
    else:
        if draft_vocab is not None:
            kwargs["draft_vocab"] = draft_vocab
        engine = SpecEngine(target, tiny_lm(vocab, 1), EngineConfig(**kwargs))
    prompts = [[(7 * b + j) % 1000 for j in range(8)] for b in range(batch)]
    params = SamplingParams(max_new_tokens=48, temperature=1.0, seed=0)
    # A first call warms every path, and gives the suffix drafter the completions the second call repeats (same
    # seed): it then finds a match and proposes at every step.
    engine.generate(prompts, params)
    steps = engine.generate_steps(prompts, params)
    for _ in range(3):  # the prefill and the first steps (the suffix drafter's matches grow with the completion)
        next(steps)
    drafted, row_steps = engine.stats.drafted, engine.stats.row_steps
    with torch.inference_mode():
        tracker = LiveBytes()
        with tracker:
            next(steps)
    steps.close()
    if engine.stats.drafted == drafted or engine.stats.row_steps - row_steps != batch:
        raise RuntimeError(f"the measured {drafter} step proposed no draft, or not every row was live")
    return tracker.peak_mib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--draft-vocab", type=int, default=32_768, help="0: skip the draft-vocabulary rows")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    cases = [("model", None), ("suffix", None)] + ([("model", args.draft_vocab)] if args.draft_vocab else [])
    for drafter, subset in cases:
        for sampler in ("rejection", "invariant"):
            try:
                mib = measure(args.vocab, args.batch, args.gamma, drafter, sampler, subset)
            except TypeError as err:  # an older checkout without draft vocabularies
                print(f"{drafter} draft_vocab={subset} {sampler}: not supported here ({err})")
                continue
            rows.append({"drafter": drafter, "draft_vocab": subset, "sampler": sampler, "peak_mib": round(mib, 1)})
            print(f"{drafter:7s} draft_vocab={subset!s:6s} {sampler:9s} peak {mib:8.1f} MiB", flush=True)
    one = args.batch * (args.gamma + 1) * args.vocab * 4 / 2**20
    print(f"(one fp32 [B, γ+1, V] tensor: {one:.1f} MiB; V = {args.vocab}, B = {args.batch}, γ = {args.gamma})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"vocab": args.vocab, "batch": args.batch, "gamma": args.gamma, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
