"""The benchmark harness: contenders raced in lockstep do the same work.

Greedy decoding is deterministic and speculative decoding is lossless, so every contender — HF
`generate`, specroll plain and specroll at fixed γ — must generate exactly the same number of tokens
on the same prompts; a harness that dropped a batch, double-counted a step or lost a generation's
last step would break that.
"""

from __future__ import annotations

from specroll.benchmarks.contenders import hf_generate, specroll
from specroll.benchmarks.engine_bench import race
from specroll.benchmarks.models import load_bench_models
from specroll.rollout import SamplingParams


def test_lockstep_race_counts_the_same_greedy_work_for_every_contender():
    models = load_bench_models("tiny", num_prompts=6)
    batches = [models.prompts[:3], models.prompts[3:6]]
    max_seq = max(map(len, models.prompts)) + 25
    contenders = [hf_generate(models.target, models.pad_id), specroll(models.target, None, 0, 3, max_seq)]
    contenders += [specroll(models.target, models.drafter, g, 3, max_seq) for g in (2, 3)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=models.stop_token_ids)
    results = race(contenders, batches, [24] * 3, params, repeats=2)
    tokens = {name: r["tokens"] for name, r in results.items()}
    assert len(set(tokens.values())) == 1, tokens
    assert all(r["seconds"] > 0 and r["tokens_per_s"] > 0 for r in results.values())
    stepped = contenders[1:]
    assert all(c.engine.stats.generated_tokens == tokens["specroll_plain"] // 2 for c in stepped)
