"""Architecture sweep: which causal-LM types of the installed transformers the engine runs exactly.

Run as ``python -m specroll.tools.arch_sweep [model_type ...]`` (all causal-LM types when none
are named). For each type it builds a tiny random model from the config class (fp32, no download:
`AutoConfig.for_model` with small sizes, a 4-token sliding window where the type has one, layer
types cycled so hybrid stacks keep every kind), and checks, on ragged prompts of 1, 5, 9 and 13
tokens (past the window):

- the type is not in the allowlist, so the engine refuses it at construction (`refused`), or
- greedy plain decoding (γ = 0) equals HF `model.generate` run on each prompt alone, and
  speculative decoding (γ = 3) equals it with the target itself and with an unrelated random model
  of the same type as drafter (`exact`); anything else is `mismatch` (a silent wrong token: the
  bug this sweep exists to catch) or `error` (an exception: building the tiny model, HF's reference
  or the engine).

For a refused type it also reports what running it with `allow_unverified_architectures=True`
gives, which is what a change to `rollout.models.architectures` must be judged by. The default test suite
runs `check_exact` over every allowlisted type (tests/test_architectures.py).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections import Counter
from dataclasses import dataclass

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.models.architectures import KNOWN_GAPS, VERIFIED_MODEL_TYPES

VOCAB = 64
WINDOW = 4
PROMPT_LENGTHS = (1, 5, 9, 13)
NEW_TOKENS = 6
GAMMA = 3
TYPE_TIMEOUT_S = 60
LOGIT_SCALE = 30.0  # peaked logits: no greedy near-ties between a batched and a row-alone forward
# Decay rates A of linear-attention / SSM layers (state × exp(-A·dt) per token): HF's random init
# draws A up to 16, so most heads forget their state within one token and a wrong state would go
# unseen; these keep ~90% of it per token.
LONG_MEMORY_A = (0.01, 0.1)
STATE_GAIN = 10.0  # and their output projections scaled up, so what the state holds moves the logits
SSM_INPUT_GAIN = 100.0  # an SSM's state term is a product of its (tiny at init) inputs x, B and C

# Small sizes, applied where the type's config has the attribute. K and V head dims of MLA differ
# on purpose (v_head_dim != qk head dim), as they do in DeepSeek-V2/V3.
SMALL = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False,
    sliding_window=WINDOW, ffn_hidden_size=64, num_experts=4, num_local_experts=4, n_routed_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, n_group=1, topk_group=1,
    first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8,
    v_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
    final_logit_softcapping=None, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
# Config arguments that are constructor-only (not attributes of a default config).
EXTRA = {
    # HF's MLA attention has as many K/V heads as query heads.
    "deepseek_v2": dict(num_key_value_heads=4),
    "deepseek_v3": dict(num_key_value_heads=4),
    "gemma4_text": dict(global_head_dim=16, num_global_key_value_heads=1),
    "falcon_h1": dict(mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8),
    "mamba2": dict(num_heads=8, state_size=8),
    # Hybrid Mamba-2 stacks default to Mamba layers only: one attention layer of the two.
    "bamba": dict(mamba_n_heads=8, mamba_d_head=8, mamba_d_state=8, attn_layer_indices=[1]),
    "granitemoehybrid": dict(mamba_n_heads=8, mamba_d_head=8, mamba_d_state=8,
                             layer_types=["linear_attention", "full_attention"]),
    "nemotron_h": dict(mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=8, n_groups=1,
                       layer_types=["linear_attention", "full_attention", "mlp"]),
}


@dataclass
class TypeResult:
    model_type: str
    status: str  # exact | refused | mismatch | error
    detail: str = ""
    unverified: str = ""  # for a refused type: the status it gets with allow_unverified_architectures


def tiny_config(model_type: str):
    """A small random-init config of `model_type` (see SMALL / EXTRA)."""
    default = AutoConfig.for_model(model_type)
    text = default.get_text_config()
    kwargs = {k: v for k, v in SMALL.items() if _settable(text, k)}
    kinds = list(dict.fromkeys(getattr(text, "layer_types", None) or ()))
    if len(kinds) > 1:
        kwargs["layer_types"] = [kinds[i % len(kinds)] for i in range(SMALL["num_hidden_layers"])]
    kwargs |= EXTRA.get(model_type, {})
    if text is default:
        return AutoConfig.for_model(model_type, **kwargs)
    default.text_config = type(text)(**kwargs)
    vision = getattr(default, "vision_config", None)
    if vision is not None:  # a multimodal model run on text alone: its vision tower is only built
        default.vision_config = type(vision)(**{k: v for k, v in VISION.items() if _settable(vision, k)})
    return default


def _settable(config, key: str) -> bool:
    """Whether `key` is a constructor argument of `config`'s class (an attribute, not a computed property)."""
    cls = type(config)
    if isinstance(getattr(cls, key, None), property):
        return False
    declared = any(key in vars(c).get("__annotations__", {}) for c in cls.__mro__)
    return declared or key in vars(config) or key in cls.attribute_map


def tiny_model(model_type: str, seed: int = 0) -> PreTrainedModel:
    """A fresh tiny fp32 model of `model_type`, output embeddings scaled by LOGIT_SCALE; in every
    mixer with a recurrent decay (an `A_log` parameter) the decay slowed to LONG_MEMORY_A, the
    output projection scaled by STATE_GAIN and an SSM's input projection by SSM_INPUT_GAIN."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type)).float().eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(LOGIT_SCALE)
        for module in model.modules():
            if isinstance(getattr(module, "A_log", None), torch.nn.Parameter):
                module.A_log.uniform_(*LONG_MEMORY_A).log_()
                for proj, gain in (("in_proj", SSM_INPUT_GAIN), ("out_proj", STATE_GAIN)):
                    if isinstance(getattr(module, proj, None), torch.nn.Linear):
                        getattr(module, proj).weight.mul_(gain)
    return model


def prompts(seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@torch.inference_mode()
def hf_greedy(model: PreTrainedModel, rows: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """HF `generate`, greedy, each prompt alone (no padding, no cache tricks)."""
    out = []
    for row in rows:
        ids = torch.tensor([row])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(gen[0, len(row):].tolist())
    return out


def engine_greedy(target: PreTrainedModel, drafter: PreTrainedModel | None, gamma: int, rows: list[list[int]],
                  allow_unverified: bool = False, new_tokens: int = NEW_TOKENS,
                  drafters: tuple[str, ...] | None = None) -> list[list[int]]:
    config = EngineConfig(max_batch_size=len(rows), max_seq_len=max(map(len, rows)) + new_tokens, gamma=gamma,
                          allow_unverified_architectures=allow_unverified, drafters=drafters)
    engine = SpecEngine(target, drafter, config)
    rollouts = engine.generate(rows, SamplingParams(max_new_tokens=new_tokens, temperature=0))
    return [r.completion_ids for r in rollouts]


def check_exact(model_type: str, allow_unverified: bool = False) -> list[str]:
    """The runs of `model_type` whose tokens differ from HF's greedy ones (empty: exact).

    Raises whatever building or running the model raises (`ValueError` at construction: refused).
    """
    target, drafter = tiny_model(model_type, seed=0), tiny_model(model_type, seed=1)
    rows = prompts()
    expected = hf_greedy(target, rows)
    runs = {"plain": (None, 0, None), "self-drafter": (target, GAMMA, None), "random-drafter": (drafter, GAMMA, None),
            "suffix+random-drafter": (drafter, GAMMA, ("suffix", "model"))}
    return [name for name, (draft, gamma, kinds) in runs.items()
            if engine_greedy(target, draft, gamma, rows, allow_unverified, drafters=kinds) != expected]


class TypeTimeout(Exception):
    pass


def _time_out(signum, frame):
    raise TypeTimeout(f"over {TYPE_TIMEOUT_S} s (tiny config not tiny for this type?)")


def run_exact(model_type: str, allow_unverified: bool) -> TypeResult:
    """`check_exact` as a result: exact, mismatch, or error (with the exception; TYPE_TIMEOUT_S at most)."""
    previous = signal.signal(signal.SIGALRM, _time_out)
    signal.alarm(TYPE_TIMEOUT_S)
    try:
        wrong = check_exact(model_type, allow_unverified)
    except Exception as err:  # the sweep reports every failure and goes on to the next type
        return TypeResult(model_type, "error", f"{type(err).__name__}: {err}".splitlines()[0][:160])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return TypeResult(model_type, "mismatch", ", ".join(wrong)) if wrong else TypeResult(model_type, "exact")


def classify(model_type: str) -> TypeResult:
    """An allowlisted type's exactness; for any other type, `refused` (the engine refuses every model
    of that `model_type`) with the status it gets run unverified."""
    if model_type in VERIFIED_MODEL_TYPES:
        return run_exact(model_type, allow_unverified=False)
    unverified = run_exact(model_type, allow_unverified=True)
    return TypeResult(model_type, "refused", KNOWN_GAPS.get(model_type, unverified.detail), unverified.status)


def sweep(model_types: list[str]) -> list[TypeResult]:
    results = []
    for model_type in model_types:
        results.append(result := classify(model_type))
        print(f"{model_type:28s} {result.status:9s} {result.unverified:9s} {result.detail}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="default: every causal-LM type of the installed transformers")
    parser.add_argument("--markdown", action="store_true", help="print the result as a markdown table")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    types = args.model_types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    print(f"# {len(types)} model types; prompts {PROMPT_LENGTHS}, {NEW_TOKENS} new tokens, gamma 0 and {GAMMA}, "
          f"window {WINDOW}, fp32 greedy vs HF generate per row")
    print(f"{'model_type':28s} {'status':9s} {'unverif.':9s} detail")
    results = sweep(types)
    if args.markdown:
        print("\n| model_type | status | run unverified | why refused / detail |\n|---|---|---|---|")
        for r in results:
            print(f"| `{r.model_type}` | {r.status} | {r.unverified} | {r.detail.replace('|', '/')} |")
    counts = Counter(r.status for r in results)
    unverified = Counter(r.unverified for r in results if r.status == "refused")
    print(f"# exact {counts['exact']}, refused {counts['refused']}, error {counts['error']}, "
          f"mismatch {counts['mismatch']} (refused types run unverified: {dict(unverified)})")
    return 1 if counts["mismatch"] else 0


if __name__ == "__main__":
    sys.exit(main())
