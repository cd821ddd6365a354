"""Draft vocabularies: a drafter drafts over a subset of the target's token ids, q = 0 outside it.

At a real vocabulary the LM head is most of a small drafter's cost (at V = 151,936 one draft token through
the target's head costs ~0.3 of a plain step on a 2-core CPU, ~0.08 through 32k rows). A `DraftVocab` holds
N target ids (sorted); a drafter with one computes its logits through those N rows of its LM head only
(`logits`), processes them as usual and draws its draft among them. Verification is unchanged — the target's
p is always over the whole vocabulary — so the output stays exactly the target's: the drafter just never
proposes a token outside the subset (EAGLE-3's `d2t` map, FR-Spec).

Which ids: the most frequent in the policy's own rollouts (`top_ids`), counted by the online learner, which
publishes a new subset with a new drafter version when the policy's token frequencies drift
(`online_drafter.token_counts`). The subset travels with the drafter version (`version.DrafterVersion.draft_vocab`),
beside its weights, on every path to an engine. Before any rollout there is no count: a head saved with the subset
it was trained over (`specroll distill --draft-vocab`) starts from that one (`carry`); otherwise `first_ids` takes
the tokenizer's first N ids (byte-level BPE numbers its merges in the order it learned them, most frequent first)
plus the stop ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from ..config import SamplingParams
from ..sampling.draft_q import DraftQ
from ..sampling.logits import process_logits

CARRIED_ATTR = "specroll_draft_vocab_ids"  # on a head loaded from a file that carried its draft vocabulary (`carry`)


class DraftVocab:
    """N sorted target token ids a drafter drafts over, and its LM head's rows for them (cached)."""

    def __init__(self, ids: torch.Tensor, vocab_size: int):
        ids = torch.as_tensor(ids)
        if ids.dim() != 1 or ids.numel() < 1 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"draft vocabulary ids {tuple(ids.shape)} {ids.dtype} are invalid: a 1-D int tensor "
                             "of at least one target id")
        ids = ids.long().unique(sorted=True)
        if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
            raise ValueError(f"draft vocabulary ids span [{int(ids[0])}, {int(ids[-1])}]: they must lie in "
                             f"[0, {vocab_size}) (the target's vocabulary)")
        self.ids = ids
        self.vocab_size = vocab_size
        self._rows: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = None

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def to(self, device: torch.device) -> DraftVocab:
        self.ids = self.ids.to(device)
        self._rows = None
        return self

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """hidden [..., H] → logits [..., N] over the draft vocabulary, through those rows of `lm_head`."""
        weight, bias = self._head_rows(lm_head)
        return nn.functional.linear(hidden, weight, bias)

    def _head_rows(self, lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's rows for `ids`, copied once and again only when the head's weights change (a policy or
        drafter update writes them in place, which bumps the tensor's version counter)."""
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device,
               None if bias is None else (bias.data_ptr(), bias._version))
        if self._rows is None or self._rows[0] != key:
            ids = self.ids.to(weight.device)
            rows = weight.index_select(0, ids)  # [N, H]
            if rows.device.type == "cpu":  # K-major, as the lean forward stores a CPU model's weights (`models.lean`)
                rows = rows.t().contiguous().t()
            self._rows = (key, rows, None if bias is None else bias.index_select(0, ids))
        return self._rows[1], self._rows[2]


def top_ids(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The `size` ids with the highest `counts` [V] (ties: lower id first), `always` included first."""
    vocab_size = counts.shape[0]
    _check_size(size, vocab_size)
    keep = [i for i in dict.fromkeys(int(a) for a in always) if 0 <= i < vocab_size][:size]
    order = torch.sort(-counts.double().cpu(), stable=True).indices  # descending, stable: lower id first on ties
    taken = torch.zeros(vocab_size, dtype=torch.bool)
    taken[keep] = True
    rest = order[~taken[order]][: size - len(keep)]
    return torch.cat([torch.tensor(keep, dtype=torch.long), rest]).sort().values


def first_ids(size: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The first `size` ids (byte-level BPE: its bytes and earliest, most frequent merges), `always` included."""
    counts = torch.arange(vocab_size, 0, -1, dtype=torch.float64)  # lower id = higher rank
    return top_ids(counts, size, always)


def carry(head: nn.Module, ids: torch.Tensor | None) -> nn.Module:
    """`head` (a drafter's weights, loaded from a state dict) with the draft vocabulary it was trained over
    (its file's, `specroll distill --draft-vocab`), which `initial_ids` then starts from."""
    setattr(head, CARRIED_ATTR, None if ids is None else torch.as_tensor(ids, dtype=torch.long).cpu())
    return head


def initial_ids(size: int, vocab_size: int, model_config, drafter: object = None) -> torch.Tensor:
    """A drafter's first draft vocabulary before any rollout was counted: the one `drafter` carries (`carry`),
    else `first_ids` with the model's EOS ids (its text config's `eos_token_id`). The engine and the online
    learner both start from it. ValueError if the carried one has other than `size` ids."""
    carried = getattr(drafter, CARRIED_ATTR, None)
    if carried is not None:
        if carried.numel() != size:
            raise ValueError(f"draft_vocab={size} is invalid with this drafter: it was trained over a draft "
                             f"vocabulary of {carried.numel()} ids, saved with it (specroll distill --draft-vocab): "
                             f"set engine.draft_vocab to {carried.numel()}, or leave it unset for the whole vocabulary")
        _check_size(size, vocab_size)
        return carried
    eos = model_config.get_text_config().eos_token_id
    stop = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return first_ids(size, vocab_size, always=stop)


def _check_size(size: int, vocab_size: int) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= vocab_size:
        raise ValueError(f"draft_vocab={size!r} is invalid: an int in [1, {vocab_size}] (the target's vocabulary)")


class VocabDraws:
    """What a drafter with an LM head does at each draft, over its draft vocabulary when it has one: its head's
    logits → the processed q → the draft (drawn by the engine's `draw` with that position's noise), and the
    step's `DraftQ`. Drafters hold one as `self.draws`.

    `head_ids` [N] (sorted target ids): the LM head is the drafter's own, one row per draft id (EAGLE-3's, whose
    `d2t` maps row i to target id i + d2t[i]); it drafts over those ids, or over those also in a `set` vocabulary
    (its rows of the head). None: the head's row r is target id r. Its `ids` are the vocabulary set on it (None:
    none), as a drafter LM with fewer head rows reports what was set: the own head's ids are its weights', fixed,
    and what travels with a drafter version (`DrafterVersion.draft_vocab`) and is compared across workers is the
    set one."""

    def __init__(self, vocab_size: int, head_ids: torch.Tensor | None = None):
        self.vocab_size = vocab_size  # the target's: what drafts are ids of
        self.vocab: DraftVocab | None = None
        self.head_ids = head_ids
        self._rows: DraftVocab | None = None  # with `head_ids`: the head's rows drafted over (None: all of them)
        self._given: DraftVocab | None = None  # with `head_ids`: the vocabulary `set` (None: none)
        if head_ids is not None:
            self.set(None, head_ids.device)

    def set(self, vocab: DraftVocab | None, device: torch.device, head_rows: int | None = None) -> None:
        """Draft over `vocab` (None: everything), its ids on `device`. `head_rows`: the LM head has only that many
        rows (a drafter LM with a smaller vocabulary than the target's): the ids past them are left out."""
        if self.head_ids is not None:
            head_ids = self.head_ids.to(device)
            keep = torch.ones_like(head_ids, dtype=torch.bool) if vocab is None else torch.isin(
                head_ids, vocab.ids.to(device))  # [N]
            if not bool(keep.any()):
                raise ValueError(f"draft vocabulary of {vocab.size} ids shares none with the drafter's own LM head "
                                 f"({head_ids.numel()} ids): give a vocabulary that overlaps them")
            self.vocab = DraftVocab(head_ids[keep], self.vocab_size)
            self._rows = None if bool(keep.all()) else DraftVocab(keep.nonzero()[:, 0], head_ids.numel())
            self._given = None if vocab is None else DraftVocab(vocab.ids.to(device), self.vocab_size)
            return
        if vocab is not None:
            ids = vocab.ids.to(device)
            vocab = DraftVocab(ids if head_rows is None else ids[ids < head_rows], self.vocab_size)
        self.vocab = vocab

    @property
    def ids(self) -> torch.Tensor | None:
        """The ids drafted over now (None: the whole vocabulary); with `head_ids`, the vocabulary set (None: none)."""
        vocab = self._given if self.head_ids is not None else self.vocab
        return None if vocab is None else vocab.ids

    @property
    def width(self) -> int:
        """K of the q this drafter proposes: N with a draft vocabulary, else the target's V."""
        return self.vocab_size if self.vocab is None else self.vocab.size

    def head(self, lm_head: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The LM head to apply: the draft vocabulary's rows of `lm_head`, or None (the head itself)."""
        rows = self._rows if self.head_ids is not None else self.vocab
        return None if rows is None else lambda hidden: rows.logits(hidden, lm_head)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """hidden [..., H] → fp32 logits [..., K]."""
        rows = self._rows if self.head_ids is not None else self.vocab
        return (lm_head(hidden) if rows is None else rows.logits(hidden, lm_head)).float()

    def draw(self, logits: torch.Tensor, params: SamplingParams, draw: Callable[..., torch.Tensor], i: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [n, K] of draft i → (q [n, K], draft [n] target ids)."""
        q = process_logits(logits, params)
        return q, draw(q, i) if self.vocab is None else draw(q, i, self.vocab.ids)

    def proposal_q(self, probs: torch.Tensor) -> DraftQ:
        """probs [n, γ, K] of a proposal as its `DraftQ`."""
        return DraftQ.over(probs, None if self.vocab is None else self.vocab.ids.to(probs.device), self.vocab_size)
