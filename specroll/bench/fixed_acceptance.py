"""FixedAcceptanceDrafter: greedy drafts kept with a stated probability α, at a real drafter's cost.

The real-shape workload (`real_shape`) checks that `gamma: "auto"` speculates where its cost table says a
drafter of per-draft acceptance α pays, and decodes plainly where it does not. Random-init models have no
acceptance one can state (two tied random models agree on nearly every greedy token), so this drafter sets it:
it runs its inner drafter's `propose` every step — the step pays that drafter's real forwards, head and
sampling — but hands the inner drafter a `draw` that returns, for each draft, the target's greedy token at that
position (from a plain reference run of the same prompts) with probability α, else a token that is surely not
it. The inner drafter feeds those drafts as its own, so its cache stays true to the row after `keep`. Every
draft is kept independently with probability α: the conditional acceptance at every position is α.

Greedy only: the proposal's q is a point mass at each draft, which the greedy rule ignores; under sampling a
draft's chance would be p(draft), not α.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from specroll.rollout import SamplingParams
from specroll.rollout.core.batch import RowBuffers
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.protocol import DraftDraw, Drafter, Proposal
from specroll.rollout.models.timing import ForwardTimes
from specroll.rollout.sampling.draft_q import DraftQ


class FixedAcceptanceDrafter:
    """`inner`'s cost, drafts kept with probability `alpha`. `references` maps each prompt (its token ids) to its
    plain greedy completion, at least as long as any budget the engine will run it with."""

    trainable = False

    def __init__(self, inner: Drafter, references: Mapping[tuple[int, ...], list[int]], alpha: float,
                 vocab_size: int, seed: int = 0):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r} is invalid: a number in [0, 1]")
        self.inner, self.references, self.alpha, self.vocab_size = inner, dict(references), alpha, vocab_size
        self.names, self.wants_hidden = inner.names, inner.wants_hidden
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def num_forwards(self) -> int:
        return self.inner.num_forwards

    def propose(self, live: slice | torch.Tensor, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        if not params.greedy:
            raise ValueError("FixedAcceptanceDrafter states its acceptance for greedy decoding only (temperature 0)")
        drafts = self._drafts(live, rows, gamma)  # [n, γ]

        def scripted(q: torch.Tensor, i: int, *args, **kwargs) -> torch.Tensor:
            draw(q, i, *args, **kwargs)  # the real draw's cost; its token is replaced
            picked = kwargs.get("rows", args[1] if len(args) > 1 else None)
            return drafts[:, i] if picked is None else drafts[picked, i]

        proposal = self.inner.propose(live, rows, gamma, params, scripted)
        n = proposal.drafts.shape[0]
        return Proposal(proposal.drafts, DraftQ.points(n, self.vocab_size, proposal.drafts.device), proposal.lengths,
                        proposal.source)

    def _drafts(self, live: slice | torch.Tensor, rows: RowBuffers, gamma: int) -> torch.Tensor:
        """[n, γ]: each row's reference tokens at its next γ positions, each replaced with probability 1 − α by
        the next id (never the target's greedy token there)."""
        tokens = rows.tokens[live].tolist()
        seq_len, prompt_len = rows.seq_len[live].tolist(), rows.prompt_len[live].tolist()
        reference = []
        for row, length, prompt in zip(tokens, seq_len, prompt_len):
            completion = self.references[tuple(row[:prompt])]
            ahead = completion[length - prompt : length - prompt + gamma]
            reference.append(ahead + [0] * (gamma - len(ahead)))  # past the budget: never verified
        reference = torch.tensor(reference, dtype=torch.long).view(len(tokens), gamma)  # [n, γ]
        kept = torch.rand(reference.shape, generator=self.generator) < self.alpha  # [n, γ]
        return torch.where(kept, reference, (reference + 1) % self.vocab_size).to(rows.tokens.device)

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        self.inner.keep(live, rows, seq_len, accepted_len, drafted_len)

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        self.inner.prefill(slots, rows, count)

    def move_row(self, src: int, dst: int) -> None:
        self.inner.move_row(src, dst)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise ValueError("FixedAcceptanceDrafter has no weights to load: its acceptance is fixed")

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.inner.set_draft_vocab(vocab)

    def cost_key(self) -> str:
        return f"fixed_acceptance:{self.inner.cost_key()}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        return self.inner.time_drafts(batch_sizes, deadline)
