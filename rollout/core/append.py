"""Appending a verified step to the live rows: kept tokens, log-probs, signals, and the host summary.

After verification each row keeps its accepted drafts and one more token, cut at its first stop token
or its length limit, and a row whose next token had no distribution ends there (`Rollout.error`).
`append_kept` writes all of it into `RowBuffers` with whole-tensor ops and copies to the host, once,
what the step's bookkeeping needs (`StepSummary`: finished slots, counts per draft position and per
drafter kind, auto-γ's evidence: `acceptance_counts`; `RowBuffers.host_seq_len` and `RowBuffers.last_step`:
each row's new length and what it kept, which the caches' host mirrors and the drafters read instead of
the device). Rolling the caches back to the kept tokens is the
engine's step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import SamplingParams
from ..sampling.accept import Verdict
from .batch import HostStep, RowBuffers
from .stats import StepSummary


@dataclass
class VerifiedStep:
    """One step's tensors for its n live rows."""

    seq_len: torch.Tensor  # [n] row lengths before the step
    drafts: torch.Tensor  # [n, γ] the proposal's drafts (`drafters.protocol.Proposal`)
    lengths: torch.Tensor | None  # [n] drafts each row proposed; None: all γ
    source: torch.Tensor | None  # [n] which drafter kind proposed each row; None: the first
    usable: torch.Tensor  # [n, γ] bool: the drafts verification could keep
    verdict: Verdict
    logits: torch.Tensor  # [n, γ+1, V] target logits (the target's dtype)
    p: torch.Tensor  # [n, γ+1, V] target processed probabilities


def append_kept(rows: RowBuffers, live: slice, step: VerifiedStep, params: SamplingParams, stop_ids: torch.Tensor,
                drafter_names: tuple[str, ...], count_evidence: bool) -> StepSummary:
    """Append each row's kept tokens (up to its stop token or length limit) with their log-probs and
    signals, and copy to the host, once, what the step's bookkeeping needs. `count_evidence`: also
    return auto-γ's acceptance counts."""
    seq_len, verdict, usable = step.seq_len, step.verdict, step.usable
    device = seq_len.device
    n, width = verdict.tokens.shape
    gamma = width - 1
    offsets = torch.arange(width, device=device)  # [γ+1]
    room = rows.max_len[live] - seq_len  # [n]
    # A row whose next token was drawn from no distribution keeps its verified drafts and ends there.
    failed = verdict.no_distribution & (verdict.accepted_len < room)  # [n]
    num_emit = torch.minimum(verdict.accepted_len + 1, room) - failed.long()  # [n]
    stopped = torch.zeros(n, dtype=torch.bool, device=device)
    if stop_ids.numel():
        is_stop = torch.isin(verdict.tokens, stop_ids) & (offsets < num_emit[:, None])  # [n, γ+1]
        stopped = is_stop.any(1)
        first_stop = torch.where(stopped, is_stop.int().argmax(1), width)
        num_emit = torch.minimum(num_emit, first_stop + 1)
        failed &= ~stopped  # a stop token among the kept drafts ends the row before the fault
    positions = (seq_len[:, None] + offsets).clamp_max(rows.tokens.shape[1] - 1)  # [n, γ+1]
    rows.tokens[live] = rows.tokens[live].scatter(1, positions, verdict.tokens)
    # Greedy's processed distribution is one-hot: report the raw model's log-probs (and T = 1 signals) instead.
    # Gathered before the log: no [n, γ+1, V] log-probs.
    index = verdict.tokens[..., None]  # [n, γ+1, 1]
    if params.greedy:
        logits = step.logits.float()
        token_logprobs = (logits.gather(-1, index) - logits.logsumexp(-1, keepdim=True)).squeeze(-1)  # [n, γ+1]
    else:
        token_logprobs = step.p.gather(-1, index).squeeze(-1).log()  # [n, γ+1]
    rows.logprobs[live] = rows.logprobs[live].scatter(1, positions, token_logprobs)
    if rows.signal_top_k:
        probs = step.logits.float().softmax(-1) if params.greedy else step.p  # [n, γ+1, V]
        rows.record_signals(live, positions, step.drafts.masked_fill(~usable, -1), verdict.accepted, probs)
    drafted_len = usable.sum(1)  # [n]
    new_len = seq_len + num_emit
    rows.seq_len[live] = new_len
    rows.stopped[live] |= stopped
    rows.num_drafted[live] += drafted_len
    rows.num_accepted[live] += verdict.accepted_len
    if count_evidence:  # what the policy learns from: each row's verdict, reach and start state
        evidence = [torch.minimum(num_emit, drafted_len), rows.rejected[live].long()]
        # A row that drafted nothing says nothing about where the drafter stands: it keeps its state.
        rows.rejected[live] = torch.where(drafted_len > 0, verdict.accepted_len < drafted_len, rows.rejected[live])
    finished = rows.stopped[live] | (new_len >= rows.max_len[live]) | failed  # [n]
    proposed = step.lengths if step.lengths is not None else torch.full_like(drafted_len, gamma)
    dropped = (proposed > 0) & (drafted_len == 0)  # [n]: rows whose non-finite q was dropped
    kinds = len(drafter_names) if gamma else 0
    # One device→host copy for everything the host needs from this step.
    parts = [torch.stack([num_emit.sum(), stopped.sum(), failed.sum(), dropped.sum()]), verdict.accepted.sum(0),
             usable.sum(0), _by_drafter(step.source, drafted_len, verdict.accepted_len, kinds),
             finished.long(), new_len, num_emit, verdict.accepted_len, drafted_len]
    if count_evidence:
        parts += evidence
    values = torch.cat([*parts, verdict.tokens.reshape(-1)]).tolist()
    emitted, num_stopped, num_failed, num_dropped = values[:4]
    cut = [4, 4 + gamma, 4 + 2 * gamma, 4 + 2 * gamma + 3 * kinds, len(values) - n * width]
    kept, drafted, by_drafter = values[cut[0] : cut[1]], values[cut[1] : cut[2]], values[cut[2] : cut[3]]
    per_row = [values[i : i + n] for i in range(cut[3], cut[4], n)]
    tokens = values[cut[4] :]
    done, emit = per_row[0], per_row[2]
    rows.last_step = HostStep(seq_len=rows.host_seq_len[:n], accepted_len=per_row[3], drafted_len=per_row[4],
                              appended=[tokens[b * width : b * width + k] for b, k in enumerate(emit)])
    rows.host_seq_len[:n] = per_row[1]
    if num_failed:
        rows.record_failures(live, failed, verdict.accepted_len, step.logits)
    # Drafts past a row's stop token or length limit were verified but never used: they are no
    # evidence about acceptance (counting them as kept would reward drafting across the end).
    counts = acceptance_counts(per_row[3], per_row[5], per_row[6], gamma) if count_evidence else None
    return StepSummary(
        finished=[slot for slot, end in enumerate(done) if end], emitted=emitted, stopped=num_stopped,
        dropped_rows=num_dropped, kept_per_position=kept, drafted_per_position=drafted,
        by_drafter={name: by_drafter[3 * k : 3 * k + 3] for k, name in enumerate(drafter_names[:kinds])},
        counts=counts, tried=sum(min(a + 1, u) for a, u in zip(per_row[3], per_row[4])),
    )


def _by_drafter(source: torch.Tensor | None, drafted_len: torch.Tensor, accepted_len: torch.Tensor,
                kinds: int) -> torch.Tensor:
    """[3 · kinds]: per drafter kind, the rows it proposed for, the drafts it proposed and those kept."""
    if not kinds:
        return drafted_len.new_zeros(0)
    source = source if source is not None else torch.zeros_like(drafted_len)  # [n]
    values = torch.stack([(drafted_len > 0).long(), drafted_len, accepted_len])  # [3, n]
    return drafted_len.new_zeros(3, kinds).scatter_add_(1, source[None].expand(3, -1), values).T.reshape(-1)  # [3·k]


def acceptance_counts(accepted_len: list[int], decided_len: list[int], after_rejection: list[int] | None,
                      gamma: int) -> list[list[int]]:
    """Per-position counts of one step's drafts: [reached, kept] from start state 0, then from state 1.

    Per row: `accepted_len` drafts kept (a prefix), the first `decided_len` drafts' outcomes mattered
    (the rest lay past the row's stop token or length limit), `after_rejection` its start state (None:
    all 0). Host lists — the engine copies them with the rest of its step summary — and O(rows + γ).
    """
    ends = [[0] * (gamma + 1) for _ in range(4)]  # how many rows' reached / kept prefix ends at each length
    states = after_rejection or [0] * len(accepted_len)
    for kept, decided, state in zip(accepted_len, decided_len, states):
        ends[2 * state][min(kept + 1, decided, gamma)] += 1
        ends[2 * state + 1][min(kept, decided)] += 1
    out = []
    for hist in ends:  # position j counts the rows whose prefix is longer than j
        count, col = sum(hist), []
        for j in range(gamma):
            count -= hist[j]
            col.append(count)
        out.append(col)
    return out
