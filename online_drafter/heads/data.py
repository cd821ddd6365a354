"""A feature head's data: token ids, the target's hidden states and its top-k p per sequence, batched, buffered.

`FeatureSequence` is one rollout (or one offline sample) as the head learner keeps it: prompt +
completion ids, the target's final-normed hidden state at every position but the last (an EAGLE-3 head's:
the states entering its target layers, k·H wide, `ModelRunner.capture_hidden`) (float16: 2·H
bytes per position — 1 KiB for the demo target's H = 512), the target's top-k processed probabilities
at each completion position (12·k bytes) and where a draft was rejected. Online they come with
verification (`EngineConfig(record_signals=True)` and an EAGLE or Medusa drafter: `RolloutSignals.hidden`),
so the learner never runs the target. Offline (`from_target`, the first version of a fresh head) one target
forward over the sample gives both, and nothing was drafted (`rejected` None).

`collate` pads sequences into a `FeatureBatch` indexed by *sequence position* j: `topk_*[:, j]` is the
target's p for token j, `weights[:, j]` the position's weight at completion positions (0 elsewhere),
`hidden[:, i]` h_i (predicts token i + 1). Each head's objective (`heads.objectives`) aligns its predictions
to j. `FeatureBuffer` is the learner's replay buffer (`buffer.ReplayBuffer`) over these sequences: per
completion position ≈ 2H + 12k + 8 bytes plus the prompt's share (the demo target, H = 512, k = 16: ~1.2 KiB;
the default 200k positions ≈ 240 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specroll.rollout import Rollout

from ..batching import pad_entries
from ..buffer import ReplayBuffer, rejected_drafts

HIDDEN_DTYPE = torch.float16


@dataclass
class FeatureSequence:
    token_ids: torch.Tensor  # [L] int64, prompt then completion
    prompt_len: int  # P
    hidden: torch.Tensor  # [L - 1, H] float16, h_i at positions 0..L-2
    topk_ids: torch.Tensor  # [T, k] int64, p's top-k at completion positions (T = L - P)
    topk_probs: torch.Tensor  # [T, k] float32
    policy_version: int = 0
    rejected: torch.Tensor | None = None  # [T] bool, a draft was proposed here and rejected; None: never drafted

    @property
    def num_positions(self) -> int:
        return self.topk_ids.shape[0]


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
                           signals.topk_ids.long(), signals.topk_probs.float(), int(rollout.policy_version),
                           rejected_drafts(signals))


@torch.inference_mode()
def from_target(target: PreTrainedModel, token_ids: list[int], prompt_len: int, temperature: float = 1.0,
                top_k: int = 16, policy_version: int = 0, layers: tuple[int, ...] | None = None) -> FeatureSequence:
    """One sample's features from one target forward (offline: a fresh head's first version). `layers`: keep the
    states entering those decoder layers, concatenated, as an EAGLE-3 head reads them (`Eagle3Head.target_layers`;
    None: the final-normed last hidden state)."""
    if not 1 <= prompt_len < len(token_ids):
        raise ValueError(f"prompt_len={prompt_len} is invalid: in [1, {len(token_ids) - 1}] for "
                         f"{len(token_ids)} tokens")
    ids = torch.tensor(token_ids, dtype=torch.long)
    base = getattr(target, target.base_model_prefix)
    out = base(input_ids=ids[None, :-1], output_hidden_states=layers is not None)
    last = out.last_hidden_state[0]  # [L-1, H]
    hidden = last if layers is None else torch.cat([out.hidden_states[i][0] for i in layers], -1)  # [L-1, k·H]
    logits = target.get_output_embeddings()(last[prompt_len - 1 :]).float()  # [T, V]
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
    weights: torch.Tensor  # [B, L] float32, the position's weight at completion positions, 0 elsewhere

    def to(self, device: torch.device | str) -> FeatureBatch:
        return FeatureBatch(*(t.to(device) for t in (self.token_ids, self.hidden, self.topk_ids, self.topk_probs,
                                                     self.weights)))


def collate(sequences: list[FeatureSequence], position_weights: list[torch.Tensor] | None = None) -> FeatureBatch:
    """Pad `sequences` into one batch; `position_weights[i]` [T_i] (default 1) at its completion positions."""
    length = max((s.token_ids.shape[0] for s in sequences), default=0)
    padded = pad_entries(sequences, length, [s.prompt_len for s in sequences], position_weights)
    hidden = torch.zeros(len(sequences), length - 1, sequences[0].hidden.shape[1])
    for b, s in enumerate(sequences):
        hidden[b, : s.token_ids.shape[0] - 1] = s.hidden.float()
    return FeatureBatch(padded.token_ids, hidden, padded.topk_ids, padded.topk_probs, padded.weights)


class FeatureBuffer(ReplayBuffer):
    """The replay buffer of `FeatureSequence`s, drawn into `FeatureBatch`es."""

    entry_type = FeatureSequence
    collate = staticmethod(collate)
