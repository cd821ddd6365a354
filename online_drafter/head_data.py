"""What a feature head learns from: token ids, the target's hidden states and its top-k p, per sequence.

`FeatureSequence` is one rollout (or one offline sample) as the head learner keeps it: prompt +
completion ids, the target's final-normed hidden state at every position but the last (float16: 2·H
bytes per position — 1 KiB for the demo target's H = 512) and the target's top-k processed
probabilities at each completion position (12·k bytes). Online they come with verification
(`EngineConfig(record_signals=True)` and an EAGLE or Medusa drafter: `RolloutSignals.hidden`), so the
learner never runs the target. Offline (`from_target`, the first version of a fresh head) one target
forward over the sample gives both.

`collate` pads sequences into a `FeatureBatch` indexed by *sequence position* j: `topk_*[:, j]` is the
target's p for token j, `weights[:, j]` 1 at completion positions, `hidden[:, i]` h_i (predicts token
i + 1). Each head's objective (`head_objectives`) aligns its predictions to j.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specroll.rollout import Rollout

HIDDEN_DTYPE = torch.float16


@dataclass
class FeatureSequence:
    token_ids: torch.Tensor  # [L] int64, prompt then completion
    prompt_len: int  # P
    hidden: torch.Tensor  # [L - 1, H] float16, h_i at positions 0..L-2
    topk_ids: torch.Tensor  # [T, k] int64, p's top-k at completion positions (T = L - P)
    topk_probs: torch.Tensor  # [T, k] float32
    policy_version: int = 0

    @property
    def num_positions(self) -> int:
        return self.topk_ids.shape[0]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.token_ids, self.hidden, self.topk_ids, self.topk_probs))


def from_rollout(rollout: Rollout) -> FeatureSequence:
    """Keep what head learning needs of a rollout; `ValueError` if it was generated without hidden states."""
    signals = rollout.signals
    if signals is None or signals.hidden is None:
        raise ValueError("rollout has no hidden states: generate with EngineConfig(record_signals=True) and an "
                         "'eagle' or 'medusa' drafter")
    token_ids = torch.tensor(list(rollout.prompt_ids) + list(rollout.completion_ids), dtype=torch.long)
    if signals.hidden.shape[0] != token_ids.shape[0] - 1:
        raise ValueError(f"rollout hidden states cover {signals.hidden.shape[0]} positions, its text has "
                         f"{token_ids.shape[0]} tokens (expected one fewer)")
    return FeatureSequence(token_ids, len(rollout.prompt_ids), signals.hidden.to(HIDDEN_DTYPE),
                           signals.topk_ids.long(), signals.topk_probs.float(), int(rollout.policy_version))


@torch.inference_mode()
def from_target(target: PreTrainedModel, token_ids: list[int], prompt_len: int, temperature: float = 1.0,
                top_k: int = 16, policy_version: int = 0) -> FeatureSequence:
    """One sample's features from one target forward (offline: a fresh head's first version)."""
    if not 1 <= prompt_len < len(token_ids):
        raise ValueError(f"prompt_len={prompt_len} is invalid: in [1, {len(token_ids) - 1}] for "
                         f"{len(token_ids)} tokens")
    ids = torch.tensor(token_ids, dtype=torch.long)
    base = getattr(target, target.base_model_prefix)
    hidden = base(input_ids=ids[None, :-1]).last_hidden_state[0]  # [L-1, H]
    logits = target.get_output_embeddings()(hidden[prompt_len - 1 :]).float()  # [T, V]
    probs = (logits / max(temperature, 1e-6)).softmax(-1) if temperature > 0 else logits.softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return FeatureSequence(ids, prompt_len, hidden.to("cpu", HIDDEN_DTYPE), top.indices.cpu(), top.values.cpu(),
                           policy_version)


@dataclass
class FeatureBatch:
    token_ids: torch.Tensor  # [B, L] int64, right-padded with 0
    hidden: torch.Tensor  # [B, L - 1, H] float32, zero past each sequence
    topk_ids: torch.Tensor  # [B, L, k] int64: p for token j
    topk_probs: torch.Tensor  # [B, L, k] float32, 0 outside completions
    weights: torch.Tensor  # [B, L] float32, 1 at completion positions

    def to(self, device: torch.device | str) -> FeatureBatch:
        return FeatureBatch(*(t.to(device) for t in (self.token_ids, self.hidden, self.topk_ids, self.topk_probs,
                                                     self.weights)))


def collate(sequences: list[FeatureSequence]) -> FeatureBatch:
    if not sequences:
        raise ValueError("collate needs at least one feature sequence")
    size, length = len(sequences), max(s.token_ids.shape[0] for s in sequences)
    width, k = sequences[0].hidden.shape[1], max(s.topk_ids.shape[1] for s in sequences)
    token_ids = torch.zeros(size, length, dtype=torch.long)
    hidden = torch.zeros(size, length - 1, width)
    topk_ids = torch.zeros(size, length, k, dtype=torch.long)
    topk_probs = torch.zeros(size, length, k)
    weights = torch.zeros(size, length)
    for b, s in enumerate(sequences):
        n, p, sk = s.token_ids.shape[0], s.prompt_len, s.topk_ids.shape[1]
        token_ids[b, :n] = s.token_ids
        hidden[b, : n - 1] = s.hidden.float()
        topk_ids[b, p:n, :sk] = s.topk_ids
        topk_probs[b, p:n, :sk] = s.topk_probs
        weights[b, p:n] = 1.0
    return FeatureBatch(token_ids, hidden, topk_ids, topk_probs, weights)
