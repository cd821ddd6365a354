"""`specroll distill`'s inputs: the policy's tokenizer, the prompts (checked against the context), the drafter to
train, and the policy's own samples — drawn with the engine in chunks saved as they finish, so a run that was
stopped samples only what it had not.

Every mistake a user can make here is a `ConfigError` (a `ValueError`) of one line naming the input.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PreTrainedModel

from specroll.integrations.model_source import load_tokenizer
from specroll.integrations.yaml_config import ConfigError
from specroll.online_drafter.heads.data import FeatureSequence, from_rollout
from specroll.rollout import EngineConfig, Rollout, SamplingParams, SpecEngine
from specroll.rollout.drafters.registry import DRAFTERS
from specroll.rollout.models.vocab import check_vocab_compatible

from .task_source import resolve

CHUNK_PROMPTS = 64  # prompts per saved chunk of samples (a chunk drains the batch at its end)
PROMPT_SEED = 9001  # the prompts' draw (a dataset function's seed); not a benchmark's (0)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def policy_tokenizer(policy: str, tokenizer: str | None) -> Any:
    """The policy's tokenizer (`tokenizer`, else the one saved with the policy). A folder without tokenizer files
    has none, whatever `AutoTokenizer` makes of it (transformers 5 builds a one-token tokenizer from a config)."""
    where = Path(tokenizer or policy)
    files = not where.is_dir() or any((where / name).is_file() for name in TOKENIZER_FILES)
    found = load_tokenizer(str(where)) if files else None
    if found is None:
        raise ConfigError(f"--tokenizer={tokenizer or policy!r} is invalid: no tokenizer found there (the policy "
                          "folder has none: pass --tokenizer with the folder of the one it was trained with)")
    return found


def load_prompts(source: str, count: int) -> list[Any]:
    """`count` prompts from a file (.jsonl rows with "prompt", .json list, or one per line of text) or a dotted
    `dataset(count, seed)` function, as `task.dataset` in a train config."""
    path = Path(source)
    if path.is_file():
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif path.suffix == ".json":
            rows = json.loads(path.read_text())
        else:
            rows = [line for line in path.read_text().splitlines() if line.strip()]
        prompts = [row["prompt"] if isinstance(row, dict) else row for row in rows][:count]
    else:
        prompts = list(resolve(source, "--prompts")(count, PROMPT_SEED))
    if not prompts:
        raise ConfigError(f"--prompts={source!r} is invalid: it gave no prompts")
    return prompts


def tokenize(prompts: list[Any], tokenizer: Any, context: int, max_new_tokens: int) -> list[list[int]]:
    """Prompt ids as TRL builds them (chat template for conversations); each must leave room for a completion."""
    if isinstance(prompts[0], list):  # conversations
        ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in prompts]
        ids = [row["input_ids"] if isinstance(row, dict) or hasattr(row, "keys") else row for row in ids]
    else:
        ids = tokenizer(text=prompts)["input_ids"]
    ids = [list(map(int, row)) for row in ids]
    for i, row in enumerate(ids):
        if not row or len(row) + max_new_tokens > context:
            raise ConfigError(f"--prompts is invalid: prompt {i} has {len(row)} tokens, and with --max-new-tokens="
                              f"{max_new_tokens} it needs {len(row) + max_new_tokens} > the context of {context} "
                              "(the policy's max_position_embeddings or --max-seq-len): shorten it or the completion")
    return ids


def fresh_drafter(kind: str, policy: PreTrainedModel, args: Any, tokenizer: Any) -> torch.nn.Module:
    """The drafter to train: a head shaped after `policy`, a smaller LM (`--drafter`, checked to share the
    tokenizer) or the policy's own first `--layers` layers."""
    spec = DRAFTERS[kind]
    if spec.is_head:  # shaped as a `models.head` file is loaded over (`engine` defaults but for distill's settings)
        return spec.fresh(EngineConfig(eagle_intermediate_size=args.eagle_intermediate_size,
                                       medusa_heads=args.medusa_heads, block_size=args.block_size), policy.config)
    if args.drafter:
        drafter = AutoModelForCausalLM.from_pretrained(args.drafter, dtype=torch.float32)
        drafter_tokenizer = load_tokenizer(args.drafter)
        try:
            check_vocab_compatible(policy, drafter, tokenizer if drafter_tokenizer else None, drafter_tokenizer)
        except ValueError as err:
            raise ConfigError(f"--drafter={args.drafter!r} is invalid: {err}") from err
        return drafter
    return first_layers(policy, args.layers)


def first_layers(policy: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A copy of `policy` keeping its embedding, its first `layers` decoder layers, final norm and LM head."""
    total = policy.config.get_text_config().num_hidden_layers
    if not 1 <= layers < total:
        raise ConfigError(f"--layers={layers} is invalid: an int in [1, {total - 1}] (the policy has {total})")
    drafter = copy.deepcopy(policy)
    base = getattr(drafter, drafter.base_model_prefix)
    base.layers = torch.nn.ModuleList(list(base.layers)[:layers])
    drafter.config.num_hidden_layers = layers
    if getattr(drafter.config, "layer_types", None):
        drafter.config.layer_types = drafter.config.layer_types[:layers]
    return drafter


def num_positions(entry: FeatureSequence | Rollout) -> int:
    """Completion positions a sample teaches (a feature sequence's, or a rollout's completion length)."""
    return entry.num_positions if isinstance(entry, FeatureSequence) else len(entry.completion_ids)


def sample(policy: PreTrainedModel, prompt_ids: list[list[int]], kind: str, args: Any, stop_ids: tuple[int, ...],
           folder: Path, head: torch.nn.Module | None = None) -> list[FeatureSequence | Rollout]:
    """The policy's samples of every prompt (`args.samples` each, plain decoding at the given settings) as a learner
    takes them (a head's: feature sequences, with the states `head` reads — an EAGLE-3 or block head's fused from
    its target layers, captured by the engine's runner; a drafter LM's: the rollouts with their signals), from
    `folder`'s saved chunks and, for the rest, the engine."""
    folder.mkdir(parents=True, exist_ok=True)
    heads = DRAFTERS[kind].is_head  # the engine records the states the head reads (gamma 0: it never drafts)
    config = EngineConfig(max_batch_size=args.batch_rows, max_seq_len=max(map(len, prompt_ids)) + args.max_new_tokens,
                          gamma=0, drafters=(kind,) if heads else None, record_signals=True, device=args.device)
    engine = None
    params = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, stop_token_ids=stop_ids)
    entries: list[Any] = []
    chunks = range(0, len(prompt_ids), CHUNK_PROMPTS)
    for start in tqdm(chunks, desc="sampling the policy", unit="chunk"):
        path = folder / f"chunk-{start // CHUNK_PROMPTS:05d}.pt"
        if not path.is_file():
            # the hidden states come with a head "drafter" (a copy: the engine may lay its modules out anew)
            engine = engine or SpecEngine(policy, copy.deepcopy(head) if heads else None, config)
            rollouts = engine.generate(prompt_ids[start : start + CHUNK_PROMPTS],
                                       SamplingParams(**params, seed=args.seed + start), n=args.samples)
            kept = [r for r in rollouts if r.completion_ids]
            torch.save([vars(from_rollout(r)) for r in kept] if heads else kept, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        if heads:
            entries += [FeatureSequence(**fields) for fields in torch.load(path, weights_only=True)]
        else:  # rollouts this command wrote into its own out folder
            entries += torch.load(path, weights_only=False)
    return entries


def draft_ids(entries: list[FeatureSequence | Rollout], size: int, vocab_size: int, stop_ids: tuple[int, ...]
              ) -> torch.Tensor:
    """The `size` ids the samples' completions use most, the stop ids always in (`draft_vocab.top_ids`)."""
    from specroll.rollout.drafters.draft_vocab import top_ids

    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for entry in entries:
        completion = (entry.token_ids[entry.prompt_len :] if isinstance(entry, FeatureSequence)
                      else torch.as_tensor(entry.completion_ids, dtype=torch.long))
        counts.index_add_(0, completion, torch.ones(completion.numel(), dtype=torch.float64))
    return top_ids(counts, size, always=stop_ids)
