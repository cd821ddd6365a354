"""SuffixDrafter: model-free drafts from the completions of the same prompt (siblings and history).

GRPO samples G completions of each prompt and sees the prompts again epoch after epoch, so a row's
next tokens often already occur in a sibling or an earlier completion after the same few tokens. The
drafter keeps, per prompt (keyed by its token ids), every completion it has seen: the live rows' as
they grow (indexed after each step) and finished ones across `generate` calls, bounded in tokens
(`SuffixConfig`: least recently used prompts go first, and within a prompt the oldest completions).
To draft for a row it finds the longest earlier occurrence of the row's last tokens (up to
`max_match`) in that prompt's completions — the row's own earlier text included — and proposes the
tokens that followed it, up to γ. The match length is its confidence: per match-length bucket a
running per-draft acceptance (`acceptance`, from `core.rates.DecayedRates`) cuts each proposal where
acceptance^position falls below `min_survival`, and `expected_accepted` is what `suffix_or_model` compares
across drafters.

The index (`suffix_index.CompletionIndex`) is hashed n-grams: for each position and each key length in
`KEY_LENS` the (sequence, position) that followed, the `candidates` most recent per key; a lookup tries
the longest key first and extends each candidate's match backwards token by token. A suffix automaton (SuffixDecoding,
arXiv 2411.04975) finds the longest match exactly and counts continuations; the n-gram table is a few
dict operations per token in plain Python and finds the matches that matter here (long ones).

q is a point mass on each proposed token, so rejection sampling keeps it with probability p(token) and
resamples from p without it: lossless like any drafter. History is data, never a correctness risk:
drafts from an older policy are only proposals the current target verifies.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..config import EngineConfig, SamplingParams, SuffixConfig
from ..core.batch import RowBuffers
from ..core.rates import DecayedRates
from ..models.rows import Rows, device_index, host_ids
from ..models.runner import ModelRunner
from ..models.timing import ForwardTimes, time_host_drafts
from ..sampling.draft_q import DraftQ
from .draft_vocab import DraftVocab
from .protocol import DraftDraw, Drafter, Proposal
from .suffix_index import KEY_LENS, CompletionIndex

# Per-draft acceptance by match length before any is measured, and the match lengths where each
# bucket starts. Measured on the demo task at T = 1 (first draft = the sampled token): 0.15 after a
# match of 1-2 tokens, ~0.3-0.5 after 3, ~0.5 after 4-7, ~0.9 after 8 or more.
BUCKET_STARTS = (1, 3, 4, 8, 12)
BUCKET_PRIORS = (0.15, 0.35, 0.5, 0.9, 0.93)
PRIOR_DRAFTS = 8  # ... worth this many drafts of evidence
DECAY = 0.999  # per step: the counts follow the policy as it moves (memory ~1000 steps)


@dataclass
class StepTokens:
    """Host copies after a step: `appended[b]` the tokens row b kept, `drafted[b]` its drafts verified,
    `accepted[b]` those kept."""

    appended: list[list[int]]
    accepted: list[int]
    drafted: list[int]


@dataclass
class Lookup:
    """Host drafts of the live rows: `drafts[b]` (≤ γ tokens) and the match they follow, `match[b]`."""

    drafts: list[list[int]]
    match: list[int]


class SuffixDrafter(Drafter):
    names = ("suffix",)
    trainable = False
    wants_hidden = False
    num_forwards = 0

    def __init__(self, slots: int, vocab_size: int, device: torch.device, config: SuffixConfig | None = None):
        self.config = config or SuffixConfig()
        self.vocab_size = vocab_size
        self.device = device
        self.index = CompletionIndex(slots, self.config)
        self.rates = DecayedRates(len(BUCKET_STARTS))  # per match-length bucket
        self._last: list[tuple[int, int]] | None = None  # (bucket, drafts) per row of the last proposal

    # ------------------------------------------------------------------ the protocol

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        return self.to_proposal(self.lookup(live.stop, gamma), gamma)

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Index the tokens each row kept this step, and count how this drafter's last proposal fared."""
        self.ingest(self.fetch(rows))

    def fetch(self, rows: RowBuffers) -> StepTokens:
        """The tokens each live row kept this step, its accepted and verified drafts: host copies the
        step already made (`RowBuffers.last_step`), no device read."""
        step = rows.last_step
        return StepTokens(step.appended, step.accepted_len, step.drafted_len)

    def ingest(self, step: StepTokens) -> None:
        if self._last is not None:
            self._count(step.appended)
            self._last = None
        for b, tokens in enumerate(step.appended):
            self.index.extend(b, tokens)

    def prefill(self, slots: Rows, rows: RowBuffers, count: torch.Tensor) -> None:
        host_slots = host_ids(slots, len(rows.host_seq_len))
        lens = [rows.host_seq_len[s] for s in host_slots]
        prompts = rows.tokens[device_index(slots), : max(lens)].tolist()
        for slot, prompt, length in zip(host_slots, prompts, lens):
            self.index.start(slot, prompt[:length])

    def move_row(self, src: int, dst: int) -> None:
        self.index.move(src, dst)

    def release(self) -> None:
        """Its index is host memory and the next phase's history: kept."""

    def allocate(self) -> None:
        """Nothing was released."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise ValueError("the suffix drafter has no weights to load")

    def learnt_state(self) -> dict[str, Any]:
        """Its `state_dict()`, as the part "suffix"."""
        return {"suffix": self.state_dict()}

    def load_learnt_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["suffix"])

    def state_dict(self) -> dict:
        """Its history and its acceptance per match length, for a resumed run (`SpecEngine.state_dict`)."""
        return {"index": self.index.state_dict(), "rates": self.rates.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Take back a `state_dict()` (between `generate` calls): the history, and the rates per match length."""
        if len(state["rates"]["kept"]) != len(BUCKET_STARTS):
            raise ValueError(f"the saved suffix drafter has {len(state['rates']['kept'])} match-length buckets; this "
                             f"one has {len(BUCKET_STARTS)}")
        self.index.load_state_dict(state["index"])
        self.rates.load_state_dict(state["rates"])
        self._last = None

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Its drafts are point masses on earlier text: no LM head to cut."""

    def draft_vocab(self) -> torch.Tensor | None:
        return None

    def cost_key(self) -> str:
        return f"suffix|{self.config.max_match}|{self.config.candidates}|{KEY_LENS}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Time lookups on a synthetic group (rows repeating one sequence: every lookup finds a match)."""
        probe = SuffixDrafter(max(batch_sizes), self.vocab_size, self.device, self.config)
        pattern = [(7 * i) % max(self.vocab_size, 2) for i in range(64)]
        for slot in range(max(batch_sizes)):
            probe.index.start(slot, [0])
            probe.index.extend(slot, pattern * 2)
        return time_host_drafts(lambda batch: probe.to_proposal(probe.lookup(batch, 8), 8), batch_sizes,
                                min(deadline, time.perf_counter() + 1.0))

    # ------------------------------------------------------------------ drafting

    def lookup(self, n: int, gamma: int) -> Lookup:
        """Up to γ drafts for each of rows [0, n), and the match length each follows (0: none)."""
        drafts, match = [], []
        for b in range(n):
            tokens, length = self.index.lookup(b, gamma)
            drafts.append(tokens)
            match.append(length)
        self._last = list(zip(match, drafts))  # scored in full: a cut draft is measured all the same
        return Lookup([d[: self.worth(m, len(d))] for d, m in zip(drafts, match)], match)

    def worth(self, match: int, drafts: int) -> int:
        """How many of `drafts` drafts after a match of `match` tokens are worth proposing (`min_survival`)."""
        if not match:
            return 0
        alpha, floor, k = self.acceptance(match), self.config.min_survival, 0
        survive = alpha
        while k < drafts and survive >= floor:
            k += 1
            survive *= alpha
        return k

    def acceptance(self, match: int) -> float:
        """Running per-draft acceptance after a match of `match` tokens (its bucket's, from a prior)."""
        k = _bucket(match)
        return self.rates.rate(k, BUCKET_PRIORS[k], PRIOR_DRAFTS)

    def to_proposal(self, found: Lookup, gamma: int) -> Proposal:
        """The proposal tensors of `found`, as wide as its longest row's drafts: a point-mass q on each.
        Drafts and lengths travel to the device in one copy."""
        gamma = max((len(d) for d in found.drafts), default=0)
        n = len(found.drafts)
        host = [t for d in found.drafts for t in d + [0] * (gamma - len(d))] + [len(d) for d in found.drafts]
        packed = torch.tensor(host, dtype=torch.long, device=self.device)  # [n·γ + n]
        drafts, lengths = packed[: n * gamma].view(n, gamma), packed[n * gamma :]  # [n, γ], [n]
        q = DraftQ.points(n, self.vocab_size, self.device)
        return Proposal(drafts, q, lengths, expected_kept=self.expected_by_width(found, gamma))

    def expected_by_width(self, found: Lookup, gamma: int, rows: list[bool] | None = None) -> list[float]:
        """[γ+1]: the suffix drafts expected kept, over its rows (`rows[b]`, default all), if w columns
        are verified."""
        out = [0.0] * (gamma + 1)
        for b, (drafts, match) in enumerate(zip(found.drafts, found.match)):
            if drafts and (rows is None or rows[b]):
                alpha, survive = self.acceptance(match), 1.0
                for k in range(1, len(drafts) + 1):
                    survive *= alpha
                    out[k] += survive
        for w in range(1, gamma + 1):
            out[w] += out[w - 1]
        return out

    def expected_accepted(self, match: int, drafts: int) -> float:
        """Expected drafts kept of a proposal of `drafts` tokens after a match of `match` tokens."""
        if not drafts or not match:
            return 0.0
        alpha = self.acceptance(match)
        return alpha * (1 - alpha**drafts) / (1 - alpha) if alpha < 1 else float(drafts)

    def _count(self, appended: list[list[int]]) -> None:
        """Score the last lookup's drafts against the tokens the rows then kept — whether or not they
        were verified, so a drafter the per-row choice passed over keeps being measured. A kept token
        equals a draft with the probability that draft is accepted (p of it, q being a point mass);
        past the kept tokens the outcome is unknown, and not counted."""
        self.rates.decay(DECAY)
        for (match, drafts), tokens in zip(self._last, appended):
            if not drafts or not tokens:
                continue
            same = 0
            while same < len(drafts) and same < len(tokens) and drafts[same] == tokens[same]:
                same += 1
            self.rates.add(_bucket(match), same, same + (same < len(drafts) and same < len(tokens)))


def _bucket(match: int) -> int:
    k = 0
    while k + 1 < len(BUCKET_STARTS) and match >= BUCKET_STARTS[k + 1]:
        k += 1
    return k


def build(drafter: None, config: EngineConfig, target: ModelRunner) -> SuffixDrafter:
    """The "suffix" kind (`registry`): model-free, configured by `config.suffix`."""
    return SuffixDrafter(config.max_batch_size, target.vocab_size, target.device, config.suffix)
