"""What each feature head predicts where, in teacher-forced form: its draft log q at every sequence position.

An objective turns a head and a `FeatureBatch` into the states [B, D, L, H] whose LM-head logits are q
for token j at each draft depth d the head scores, and any auxiliary loss (`HeadOutput`; `.log_q` is the
whole [B, D, L, V]), so the learner's losses and scores (`divergence`: the target's recorded top-k p
against q) are the same code for every head. The scorer (`heads.scorer`) takes the LM head only at
completion positions and through the draft vocabulary's rows: at a 32k vocabulary the full head over
every position was most of a step. The alignments follow the drafters (`rollout.drafters.eagle`,
`rollout.drafters.medusa`):

- EAGLE (D = 2): the pair (h_i, x_{i+1}) at position i predicts h_{i+1}, whose logits are q for token
  i + 2 — the first draft, with the causal context of every real pair before it, as in the engine. Its
  later drafts feed predicted features, so depth 2 feeds the head its own prediction of h_i over the
  real context (the engine's second draft); and EAGLE's feature-regression term (smooth L1 of the
  predicted h_{i+1} to the real one, `feature_weight`) keeps the predictions in the target's space.
- Medusa (D = K): head k reads h_i and predicts token i + 1 + k.
- EAGLE-3 (D = the head's `ttt_steps`): its training-time test (`Eagle3Objective`), the head unrolled on its
  own outputs for D steps, each step's q scored.
- Recurrent (D = the head's `depths`, `RecurrentObjective`): the state started at h_i and fed x_{i+1} … x_{i+d}
  predicts token i + d + 1 — the engine's d-th draft when the drafts before it were kept (teacher forcing is exact
  here: the state holds nothing but the tokens fed).

Positions a head cannot predict (the first tokens) get a zero state (a uniform q through a bias-free head),
and count as the poor drafts they are.

The embedding and LM head are the policy's own modules, read at every call (`_frozen_embed`,
`_frozen_logits`: detached weights, cast to the head's dtype), so the objective follows the policy as it
is updated in place, and no gradient ever reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from specroll.rollout.drafters.heads import EagleHead, MedusaHeads, RecurrentHead
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

from .data import FeatureBatch


@dataclass
class HeadOutput:
    states: torch.Tensor  # [B, D, L, H]: the state whose logits are q for token j at depth d (0 where none)
    aux_loss: torch.Tensor  # scalar added to the distillation loss (0 if none)
    temperature: float
    lm_head: nn.Module | None  # the policy's LM head the states go through (read frozen); None: `own_logits`
    own_logits: Callable[[torch.Tensor], torch.Tensor] | None = None  # [..., H] -> [..., V]: the head's own LM head

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """[..., V] over the target's vocabulary for states [..., H]."""
        return _frozen_logits(self.lm_head, states) if self.lm_head is not None else self.own_logits(states)

    @property
    def log_q(self) -> torch.Tensor:
        """[B, D, L, V]: the head's draft log-probabilities for token j at depth d, at every position."""
        return (self.logits(self.states).float() / self.temperature).log_softmax(-1)


class HeadObjective(Protocol):
    depths: int  # draft depths scored per position (D)

    def __call__(self, head: nn.Module, batch: FeatureBatch, temperature: float, depths: int | None = None
                 ) -> HeadOutput:
        """log q at the first `depths` draft depths (None: all `self.depths`)."""
        ...


def _shifted(states: torch.Tensor, shift: int, length: int) -> torch.Tensor:
    """States [B, N, H] at positions i placed at i + shift of a length-`length` axis (zeros before): [B, L, H]."""
    size, _, width = states.shape
    pad = states.new_zeros(size, shift, width)
    return torch.cat([pad, states], 1)[:, :length]


def _frozen_embed(embed: nn.Module, ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, embed.weight.detach().to(like.device, like.dtype))


def _frozen_logits(lm_head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    bias = None if lm_head.bias is None else lm_head.bias.detach().to(x.device, x.dtype)
    return F.linear(x, lm_head.weight.detach().to(x.device, x.dtype), bias)


class EagleObjective:
    """Depth 1: real features. Depth 2: each pair's feature is the head's own prediction of it (from the
    pair before), attending over the *real* pairs before it and itself — exactly what the engine's second
    draft sees when the first was kept (the "training-time test" of EAGLE-3 / HASS, one step of it). With
    `depths=1` (`LearnerConfig.train_depths`) only the first, in one causal pass: ~2x cheaper a step."""

    depths = 2

    def __init__(self, embed: nn.Module, lm_head: nn.Module, feature_weight: float = 1.0):
        self.embed, self.lm_head, self.feature_weight = embed, lm_head, feature_weight

    def __call__(self, head: EagleHead, batch: FeatureBatch, temperature: float, depths: int | None = None
                 ) -> HeadOutput:
        size, length = batch.token_ids.shape
        pairs = length - 1
        device = batch.hidden.device
        positions = torch.arange(pairs, device=device)[None].expand(size, -1)
        embeds = _frozen_embed(self.embed, batch.token_ids[:, 1:], batch.hidden)  # [B, N, H]: x_{i+1}
        real_kv: list[torch.Tensor] = []

        def keep_real(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            real_kv[:] = [k, v]
            return k, v

        if depths == 1:  # the first draft only: one causal pass (no key/value to keep for a second)
            drafted = [head(embeds, batch.hidden, positions)]  # [B, N, H]: h_{i+1}
        else:
            causal = torch.ones(pairs, pairs, dtype=torch.bool, device=device).tril()
            drafted = [head(embeds, batch.hidden, positions, keep_real, causal[None, None])]
            own = torch.cat([drafted[0].new_zeros(size, 1, drafted[0].shape[-1]), drafted[0][:, :-1]], 1)  # ĥ_i

            def after_real(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return torch.cat([real_kv[0], k], 2), torch.cat([real_kv[1], v], 2)

            eye = torch.eye(pairs, dtype=torch.bool, device=device)
            drafted.append(head(embeds, own, positions, after_real, torch.cat([causal & ~eye, eye], 1)[None, None]))
        states = torch.stack([_shifted(x, 2, length) for x in drafted], 1)  # [B, D, L, H]
        predicted = drafted[0].float()
        real = batch.hidden[:, 1:]  # [B, L-2, H]
        valid = (real.abs().sum(-1) > 0).float()  # [B, L-2]: padding is all zeros
        error = F.smooth_l1_loss(predicted[:, :-1], real, reduction="none").mean(-1)
        aux = self.feature_weight * (error * valid).sum() / valid.sum().clamp_min(1)
        return HeadOutput(states, aux, temperature, self.lm_head)


class MedusaObjective:
    def __init__(self, lm_head: nn.Module, num_heads: int):
        self.lm_head, self.depths = lm_head, num_heads

    def __call__(self, head: MedusaHeads, batch: FeatureBatch, temperature: float, depths: int | None = None
                 ) -> HeadOutput:
        states = head(batch.hidden)  # [B, L-1, K, H]: head k (0-based) at i predicts token i + 2 + k
        length = batch.token_ids.shape[1]
        per_head = torch.stack([_shifted(states[:, :, k], k + 2, length) for k in range(depths or self.depths)], 1)
        return HeadOutput(per_head, per_head.new_zeros(()), temperature, self.lm_head)  # [B, K, L, H]


class Eagle3Objective:
    """EAGLE-3's training-time test. Step 1: pair i is (fc(target states at i), x_{i+1}) at position i, attending
    causally over the real pairs, and its output o¹_i gives q for token i + 2 (the engine's first draft). Step s:
    element i feeds (o^{s-1}_i, x_{i+s}) at position i + s - 1 — its own earlier output with the token a kept
    draft would be — attending over the real pairs ≤ i and its own chain's earlier steps (keys of step 1 causal,
    of each later step only its own element: vllm-project/speculators' diagonal mask), and gives q for token
    i + s + 1: what the engine's s-th draft sees when the drafts before it were kept. Trained at the first
    `LearnerConfig.train_depths` steps (None: all `ttt_steps`). No feature-regression term (EAGLE-3 dropped it).
    With an own LM head q is over its draft ids (log q = -inf elsewhere, as in the engine and as `divergence`
    reads a draft vocabulary: the target's mass there is in no bucket of the loss)."""

    def __init__(self, embed: nn.Module, lm_head: nn.Module, steps: int):
        self.embed, self.lm_head, self.depths = embed, lm_head, steps

    def __call__(self, head: Eagle3Head, batch: FeatureBatch, temperature: float, depths: int | None = None
                 ) -> HeadOutput:
        size, length = batch.token_ids.shape
        pairs = length - 1
        device = batch.hidden.device
        causal = torch.ones(pairs, pairs, dtype=torch.bool, device=device).tril()
        eye = torch.eye(pairs, dtype=torch.bool, device=device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []

        def chained(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keys.append(k)
            values.append(v)
            return torch.cat(keys, 2), torch.cat(values, 2)  # [B, Hkv, s·N, D]

        hidden = head.fuse(batch.hidden)  # [B, N, H]
        per_step = []
        for step in range(depths or self.depths):
            ids = F.pad(batch.token_ids[:, 1 + step :], (0, step))  # [B, N]: x_{i+1+step}
            positions = (torch.arange(pairs, device=device) + step)[None].expand(size, -1)
            mask = torch.cat([causal] + [eye] * step, 1)[None, None]  # [1, 1, N, (step+1)·N]
            hidden = head(_frozen_embed(self.embed, ids, hidden), hidden, positions, chained, mask)  # [B, N, H]
            per_step.append(_shifted(head.final(hidden), step + 2, length))
        states = torch.stack(per_step, 1)  # [B, D, L, H]
        return _through_lm_head(head, states, temperature, self.lm_head)


class RecurrentObjective:
    """The ReDrafter head unrolled over the real tokens: at every position i at once, s_0 = h_i and step d feeds
    x_{i+d} (`RecurrentHead.cell`); the readout of s_d gives q for token i + d + 1. The first `depths` steps (None:
    the head's `depths`). With an own LM head q is over its draft ids, as EAGLE-3's."""

    def __init__(self, embed: nn.Module, lm_head: nn.Module, depths: int):
        self.embed, self.lm_head, self.depths = embed, lm_head, depths

    def __call__(self, head: RecurrentHead, batch: FeatureBatch, temperature: float, depths: int | None = None
                 ) -> HeadOutput:
        length = batch.token_ids.shape[1]
        hidden = batch.hidden  # [B, N, H]: h_i, N = L - 1
        pairs = hidden.shape[1]
        state, per_step = hidden, []
        for step in range(1, (depths or self.depths) + 1):
            ids = F.pad(batch.token_ids[:, step:], (0, step - 1))[:, :pairs]  # [B, N]: x_{i+step}
            state = head.cell(state, _frozen_embed(self.embed, ids, hidden))
            per_step.append(_shifted(head.readout(hidden, state), step + 1, length))
        return _through_lm_head(head, torch.stack(per_step, 1), temperature, self.lm_head)  # [B, D, L, H]


def _through_lm_head(head: Eagle3Head | RecurrentHead, states: torch.Tensor, temperature: float,
                     lm_head: nn.Module) -> HeadOutput:
    """The states' output through the policy's frozen LM head, or the head's own over its `draft_ids` (log q =
    -inf at the target's other ids, as in the engine and as `divergence` reads a draft vocabulary: the target's
    mass there is in no bucket of the loss)."""
    if head.lm_head is None:
        return HeadOutput(states, states.new_zeros(()), temperature, lm_head)
    vocab = lm_head.weight.shape[0]

    def own_logits(x: torch.Tensor) -> torch.Tensor:
        """[..., V] over the target's vocabulary from the head's own (trained) LM head over its draft ids."""
        own = head.lm_head(x)  # [..., K]
        full = own.new_full((*own.shape[:-1], vocab), float("-inf"))
        return full.index_copy(-1, head.draft_ids.to(own.device), own)

    return HeadOutput(states, states.new_zeros(()), temperature, None, own_logits)


def objective_for(head: nn.Module, embed: nn.Module, lm_head: nn.Module, feature_weight: float = 1.0
                  ) -> HeadObjective:
    if isinstance(head, Eagle3Head):
        return Eagle3Objective(embed, lm_head, head.ttt_steps)
    if isinstance(head, EagleHead):
        return EagleObjective(embed, lm_head, feature_weight)
    if isinstance(head, MedusaHeads):
        return MedusaObjective(lm_head, head.num_heads)
    if isinstance(head, RecurrentHead):
        return RecurrentObjective(embed, lm_head, head.depths)
    raise ValueError(f"no head objective for {type(head).__name__}: an EagleHead, Eagle3Head, MedusaHeads or "
                     "RecurrentHead")
