"""RowBuffers: the per-slot state of the live batch, as device tensors.

Token ids, lengths, budgets, random-stream keys, log-probabilities and (optionally) learning signals
of every slot live here so that a step updates all rows with whole-tensor ops; a request's Python
lists are only built when it finishes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .request import FinishedRow, RolloutSignals

SIGNAL_HIDDEN_DTYPE = torch.float16  # recorded hidden states (`RolloutSignals.hidden`): 2·H bytes per position


@dataclass
class HostStep:
    """The last step of live rows [0, n) on the host, from its one device→host copy (`core.append.append_kept`)."""

    seq_len: list[int]  # each row's length before the step
    accepted_len: list[int]  # drafts kept
    drafted_len: list[int]  # drafts verified (usable)
    appended: list[list[int]]  # the tokens each row kept


class RowBuffers:
    def __init__(self, batch: int, length: int, device: torch.device, signal_top_k: int | None,
                 hidden_size: int | None = None, hidden_dtype: torch.dtype = torch.float32):
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.tokens = zeros(batch, length)  # [B, L] prompt then completion
        self.seq_len = zeros(batch)  # [B] tokens held (prompt + completion)
        self.prompt_len = zeros(batch)  # [B]
        self.max_len = zeros(batch)  # [B] prompt_len + this row's max_new_tokens
        self.keys = zeros(batch)  # [B] the request's random-stream key (`sampling.randomness.request_keys`)
        self.logprobs = zeros(batch, length, dtype=torch.float32)  # [B, L] at completion positions
        self.num_drafted = zeros(batch)  # [B]
        self.num_accepted = zeros(batch)  # [B]
        self.stopped = zeros(batch, dtype=torch.bool)  # [B] emitted a stop token
        self.rejected = zeros(batch, dtype=torch.bool)  # [B] the last speculative step ended in a rejection
        # Host copies of seq_len and max_len, kept in step by the engine, so that a step's shape costs
        # no device→host copy of its own.
        self.host_seq_len = [0] * batch
        self.host_max_len = [0] * batch
        self.host_error: list[str | None] = [None] * batch  # why the row failed (set only when it does)
        self.last_step: HostStep | None = None  # set by each step
        self.signal_top_k = signal_top_k
        if signal_top_k:
            self.topk_ids = zeros(batch, length, signal_top_k)  # [B, L, k]
            self.topk_probs = zeros(batch, length, signal_top_k, dtype=torch.float32)  # [B, L, k]
            self.draft_ids = zeros(batch, length)  # [B, L], -1 = not drafted
            self.draft_accepted = zeros(batch, length, dtype=torch.bool)  # [B, L]
        # [B, L, H] the target's final-normed hidden state at each position its verification fed, for a
        # drafter that reads it (`drafters.hidden`); valid below seq_len - 1. None: no drafter asks.
        self.hidden = zeros(batch, length, hidden_size, dtype=hidden_dtype) if hidden_size else None

    def _fields(self) -> list[torch.Tensor]:
        fields = [
            self.tokens, self.seq_len, self.prompt_len, self.max_len, self.keys, self.logprobs,
            self.num_drafted, self.num_accepted, self.stopped, self.rejected,
        ]
        if self.signal_top_k:
            fields += [self.topk_ids, self.topk_probs, self.draft_ids, self.draft_accepted]
        if self.hidden is not None:
            fields.append(self.hidden)
        return fields

    def load(self, slot: int, prompt: list[int], max_new_tokens: int, key: int) -> None:
        for t in self._fields():
            t[slot] = 0
        n = len(prompt)
        self.tokens[slot, :n] = torch.tensor(prompt, dtype=torch.long, device=self.tokens.device)
        self.seq_len[slot] = n
        self.prompt_len[slot] = n
        self.max_len[slot] = n + max_new_tokens
        self.keys[slot] = key
        self.host_seq_len[slot], self.host_max_len[slot] = n, n + max_new_tokens
        self.host_error[slot] = None
        if self.signal_top_k:
            self.draft_ids[slot] = -1

    def move_row(self, src: int, dst: int) -> None:
        for t in self._fields():
            t[dst] = t[src]
        self.host_seq_len[dst], self.host_max_len[dst] = self.host_seq_len[src], self.host_max_len[src]
        self.host_error[dst] = self.host_error[src]

    def record_signals(self, live: slice, positions: torch.Tensor, drafts: torch.Tensor, accepted: torch.Tensor,
                       probs: torch.Tensor) -> None:
        """Keep the top-k of `probs` [n, γ+1, V] at `positions` [n, γ+1], the drafts [n, γ] and whether each
        was kept [n, γ]."""
        n, k = drafts.shape[0], min(self.signal_top_k, probs.shape[-1])
        top = probs.topk(k, dim=-1)  # [n, γ+1, k]
        pos_k = positions[..., None].expand(-1, -1, k)
        # `live` is a slice, so these are views: scatter in place instead of copying [n, L, k] per step.
        self.topk_ids[live, :, :k].scatter_(1, pos_k, top.indices)
        self.topk_probs[live, :, :k].scatter_(1, pos_k, top.values)
        self.draft_ids[live].scatter_(1, positions, torch.cat([drafts, drafts.new_full((n, 1), -1)], 1))
        self.draft_accepted[live].scatter_(1, positions, torch.cat([accepted, accepted.new_zeros(n, 1)], 1))

    def record_failures(self, live: slice, failed: torch.Tensor, accepted_len: torch.Tensor,
                        logits: torch.Tensor) -> None:
        """Say, for each failed row [n] bool, what was non-finite and where in `logits` [n, γ+1, V] (rare:
        its own device→host copies)."""
        slots = failed.nonzero()[:, 0]  # [k]
        at = logits[slots, accepted_len[slots]]  # [k, V]: the target logits its next token needed
        kinds = torch.stack([at.isnan().any(-1), at.isposinf().any(-1)], 1).tolist()
        seq_len, prompt_len = self.seq_len[live][slots].tolist(), self.prompt_len[live][slots].tolist()
        for slot, (nan, posinf), length, start in zip(slots.tolist(), kinds, seq_len, prompt_len):
            kind = "NaN" if nan else "+inf" if posinf else "all -inf"
            self.host_error[slot] = (
                f"target logits are non-finite ({kind}) at completion token {length - start} (sequence "
                f"position {length}): no distribution to draw it from; the row ends with the tokens before it"
            )

    def export(self, slots: list[int]) -> list[FinishedRow]:
        """Finished rows' completions, counters and signals, with one device→host copy per buffer."""
        idx = torch.tensor(slots, dtype=torch.long, device=self.tokens.device)
        meta = torch.stack([self.prompt_len, self.seq_len, self.stopped.long(), self.num_drafted,
                            self.num_accepted])[:, idx].T.tolist()  # [len(slots), 5]
        tokens, logprobs = self.tokens[idx].cpu(), self.logprobs[idx].cpu()
        if self.signal_top_k:
            signal_rows = [t[idx].cpu() for t in (self.topk_ids, self.topk_probs, self.draft_ids, self.draft_accepted)]
            hidden = self.hidden[idx].to("cpu", SIGNAL_HIDDEN_DTYPE) if self.hidden is not None else None
        out = []
        for i, (start, end, stopped, drafted, accepted) in enumerate(meta):
            signals = None
            if self.signal_top_k:
                signals = RolloutSignals(*(t[i, start:end].clone() for t in signal_rows),
                                         hidden=None if hidden is None else hidden[i, : end - 1].clone())
            out.append(FinishedRow(
                completion_ids=tokens[i, start:end].tolist(), logprobs=logprobs[i, start:end].tolist(),
                stopped=bool(stopped), num_drafted=drafted, num_accepted=accepted, signals=signals,
                error=self.host_error[slots[i]],
            ))
        return out
