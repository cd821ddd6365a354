"""TargetSignals: what the online learner trains on, for rollouts from an engine that records nothing (vLLM), when
`learner.signals` is "forward" (`signal_source`; "trainer" takes them from TRL's own loss forward instead, at no extra
target forward).

specroll's own engine records the target's top-k processed probabilities at every generated position for free
(verification computes them). vLLM returns tokens and log-probabilities only, so these signals take one forward of
the policy over prompt + completion per rollout — a prefill-shaped pass, all positions at once:

    signals = TargetSignals(policy_copy, top_k=16)          # a Hugging Face model with the served policy's weights
    signals.record(rollouts, params)                        # sets each rollout's `signals`

The forward runs right-padded batches of rollouts (causal attention: padding after a row's tokens cannot reach
them). For a drafter that reads the target's features it also keeps the hidden states the engine would have
recorded (`RolloutSignals.hidden`: the final-normed last layer, or the residual stream entering `capture_layers`
for EAGLE-3). No draft was proposed at any position as far as the learner knows (`draft_ids` -1): vLLM does not
say which drafts it kept where, only how many per rollout.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel

from specroll.integrations.signal_source import top_k_signals
from specroll.rollout import Rollout, SamplingParams
from specroll.rollout.core.request import RolloutSignals

HIDDEN_DTYPE = torch.float16  # as `RolloutSignals.hidden` documents
MAX_BATCH_TOKENS = 16_384  # tokens per forward (rows × padded length)


class TargetSignals:
    """Records `RolloutSignals` for finished rollouts with a forward of `model` (see the module doc)."""

    def __init__(self, model: PreTrainedModel, top_k: int, hidden: bool = False,
                 capture_layers: tuple[int, ...] | None = None):
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"signal_top_k={top_k!r} is invalid: an int >= 1")
        self.model = model
        self.top_k = top_k
        self.hidden = hidden or capture_layers is not None
        self.capture_layers = capture_layers
        self.seconds = 0.0  # spent in `record`, all calls together (what the signals cost)

    @torch.inference_mode()
    def record(self, rollouts: list[Rollout], params: SamplingParams) -> None:
        """Set `signals` on every rollout: the policy's top-k processed p at each completion position (for greedy
        params the T = 1 distribution, as the engine records it)."""
        started = time.perf_counter()
        order = sorted(range(len(rollouts)), key=lambda i: -len(rollouts[i].prompt_ids + rollouts[i].completion_ids))
        start = 0
        while start < len(order):
            longest = len(rollouts[order[start]].prompt_ids) + len(rollouts[order[start]].completion_ids)
            rows = max(1, MAX_BATCH_TOKENS // max(1, longest))
            batch = [rollouts[i] for i in order[start:start + rows]]
            self._record_batch(batch, params, longest)
            start += rows
        self.seconds += time.perf_counter() - started

    def _record_batch(self, batch: list[Rollout], params: SamplingParams, length: int) -> None:
        device = next(self.model.parameters()).device
        ids = torch.zeros(len(batch), length, dtype=torch.long)
        for b, r in enumerate(batch):
            tokens = r.prompt_ids + r.completion_ids
            ids[b, :len(tokens)] = torch.tensor(tokens)
        out = self.model(input_ids=ids.to(device), output_hidden_states=self.hidden, use_cache=False)
        for b, r in enumerate(batch):
            prompt, total = len(r.prompt_ids), len(r.prompt_ids) + len(r.completion_ids)
            logits = out.logits[b, prompt - 1:total - 1]  # [T, V]: position t predicts completion token t
            ids, probs = top_k_signals(logits, params, self.top_k)
            steps = len(r.completion_ids)
            r.signals = RolloutSignals(
                topk_ids=ids, topk_probs=probs,
                draft_ids=torch.full((steps,), -1, dtype=torch.long), accepted=torch.zeros(steps, dtype=torch.bool),
                hidden=self._hidden(out.hidden_states, b, total) if self.hidden else None)

    def _hidden(self, states: tuple[torch.Tensor, ...], b: int, total: int) -> torch.Tensor:
        """[total - 1, H] (or [total - 1, k·H]) for row b: every position but the last, as the engine records."""
        if self.capture_layers is None:
            picked = states[-1][b, :total - 1]  # HF's last hidden state is final-normed
        else:
            picked = torch.cat([states[i][b, :total - 1] for i in self.capture_layers], dim=-1)
        return picked.to(HIDDEN_DTYPE).cpu()
