"""RowBuffers: the per-slot state of the live batch, as device tensors.

Token ids, lengths, budgets, log-probabilities and (optionally) learning signals of every slot live
here so that a step updates all rows with whole-tensor ops; a request's Python lists are only built
when it finishes.
"""

from __future__ import annotations

import torch

from .request import RolloutSignals


class RowBuffers:
    def __init__(self, batch: int, length: int, device: torch.device, signal_top_k: int | None):
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.tokens = zeros(batch, length)  # [B, L] prompt then completion
        self.seq_len = zeros(batch)  # [B] tokens held (prompt + completion)
        self.prompt_len = zeros(batch)  # [B]
        self.max_len = zeros(batch)  # [B] prompt_len + this row's max_new_tokens
        self.logprobs = zeros(batch, length, dtype=torch.float32)  # [B, L] at completion positions
        self.num_drafted = zeros(batch)  # [B]
        self.num_accepted = zeros(batch)  # [B]
        self.stopped = zeros(batch, dtype=torch.bool)  # [B] emitted a stop token
        self.signal_top_k = signal_top_k
        if signal_top_k:
            self.topk_ids = zeros(batch, length, signal_top_k)  # [B, L, k]
            self.topk_probs = zeros(batch, length, signal_top_k, dtype=torch.float32)  # [B, L, k]
            self.draft_ids = zeros(batch, length)  # [B, L], -1 = not drafted
            self.draft_accepted = zeros(batch, length, dtype=torch.bool)  # [B, L]

    def _fields(self) -> list[torch.Tensor]:
        fields = [
            self.tokens, self.seq_len, self.prompt_len, self.max_len, self.logprobs,
            self.num_drafted, self.num_accepted, self.stopped,
        ]
        if self.signal_top_k:
            fields += [self.topk_ids, self.topk_probs, self.draft_ids, self.draft_accepted]
        return fields

    def load(self, slot: int, prompt: list[int], max_new_tokens: int) -> None:
        for t in self._fields():
            t[slot] = 0
        n = len(prompt)
        self.tokens[slot, :n] = torch.tensor(prompt, dtype=torch.long, device=self.tokens.device)
        self.seq_len[slot] = n
        self.prompt_len[slot] = n
        self.max_len[slot] = n + max_new_tokens
        if self.signal_top_k:
            self.draft_ids[slot] = -1

    def move_row(self, src: int, dst: int) -> None:
        for t in self._fields():
            t[dst] = t[src]

    def completion(self, slot: int) -> tuple[list[int], list[float]]:
        start, end = int(self.prompt_len[slot]), int(self.seq_len[slot])
        return self.tokens[slot, start:end].tolist(), self.logprobs[slot, start:end].tolist()

    def signals(self, slot: int) -> RolloutSignals | None:
        if not self.signal_top_k:
            return None
        start, end = int(self.prompt_len[slot]), int(self.seq_len[slot])
        return RolloutSignals(
            topk_ids=self.topk_ids[slot, start:end].clone(),
            topk_probs=self.topk_probs[slot, start:end].clone(),
            draft_ids=self.draft_ids[slot, start:end].clone(),
            accepted=self.draft_accepted[slot, start:end].clone(),
        )
