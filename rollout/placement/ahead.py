"""`AheadDrafter`: the drafter LM on its own device or cores (`EngineConfig.drafter_device`) and, with
`EngineConfig.overlap`, drafting step t + 1 while the target verifies step t (PEARL, Liu et al., ICLR 2025).

PEARL's post-verify, as done here for chains of the drafter LM: when a step's γ drafts are proposed (d_1 … d_γ, the
drafter's cache holding the row up to d_{γ-1}), the chain step hands them to `draft_ahead`, which starts, on the
drafter's thread, the drafts of the next step *as if every draft of this one is kept*: feed d_γ, draw e_1 (the
drafter's guess of the token the target draws after d_γ), feed it, draw e_2 … e_{γ+1} — each with the token noise of
its sequence position, the noise a serial drafter would draw it with. The target's forward runs meanwhile. After
verification (`keep`) a row whose γ drafts were all kept and whose drawn token is e_1 keeps that work: its cache
already holds its new last token, and e_2 … e_{γ+1} are exactly the drafts the next step's drafter would propose for
it (same prefix, same noise); every other row's cache is rolled back to its kept prefix (a length, nothing copied) and
its next drafts are drafted in the step, as in series. PEARL's pre-verify (the target checking the first draft while
the rest is drafted) is not done: at the batch sizes this engine runs, a target forward of 1 token costs about one of
γ + 1, so it would double the target's work.

Lossless under both accept rules: a draft kept from ahead was drawn from the drafter's q given the row's real prefix
with the noise of its position — what the serial step would have drawn; only which rows draft in the step depends on
the previous step's outcome, never on the noise of the positions drafted. The output is decided by verification
alone, and under the invariant sampler equals plain decoding's.

On another device (a CPU drafter beside a CUDA target) the transfers are explicit and per step: the live rows' tokens
to the drafter (`_local`), the proposal (drafts and q) back to the target's device; the drafter draws with its own
copy of the rows' noise (the same numbers: noise is a function of request, position and purpose).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..config import EngineConfig, SamplingParams
from ..core.batch import HostStep, RowBuffers
from ..drafters.draft_vocab import DraftVocab
from ..drafters.factory import make_drafter
from ..drafters.model import ModelDrafter
from ..drafters.protocol import DraftDraw, Drafter, Proposal
from ..models.rows import RowIds, Rows, device_index, host_ids
from ..models.runner import ModelRunner
from ..models.timing import ForwardTimes
from ..sampling.draft_q import DraftQ
from ..sampling.noise import StepNoise
from .device import DrafterPlacement, parse_drafter_device
from .threads import DrafterThread, TargetCores

PLACED_KINDS = ("model",)  # the drafter kinds `drafter_device` and `overlap` serve


@dataclass
class LocalRows:
    """What the drafter LM reads of `RowBuffers`, copied to its device: the first rows' tokens, lengths and keys."""

    tokens: torch.Tensor  # [n, L]
    seq_len: torch.Tensor  # [n]
    keys: torch.Tensor  # [n]
    host_seq_len: list[int]
    last_step: HostStep | None


@dataclass
class Ahead:
    """The next step's drafts of every live row, drafted beside verification (`AheadDrafter.draft_ahead`)."""

    gamma: int  # the step's γ: the drafts it verifies, and the drafts drafted ahead past the guess
    drafts: torch.Tensor  # [n, γ+1]: e_1 (the guess of the token drawn after the step's drafts), then the next drafts
    probs: torch.Tensor  # [n, γ+1, K] their q
    guess: list[int]  # e_1 per row, on the host (copied on the drafter's thread)


class AheadDrafter(Drafter):
    """The drafter LM `inner` on `placement`, its work on `thread` (None: the engine's thread), drafting ahead where the
    step's plan says so (module docstring)."""

    names = ("model",)
    trainable = True
    wants_hidden = False

    def __init__(self, inner: ModelDrafter, placement: DrafterPlacement, target_device: torch.device,
                 thread: DrafterThread | None, target_cores: TargetCores | None):
        self.inner, self.placement, self.target_device = inner, placement, target_device
        self.thread, self.target_cores = thread, target_cores
        if thread is not None:  # a dropped engine's drafter stops its thread (without waiting: GC may run on it)
            weakref.finalize(self, thread.close, False)
        self.device = inner.runner.device
        slots = len(inner.runner.cache.host_lens)
        self.ready = [False] * slots  # slot → its next drafts were drafted ahead and kept (post-verify)
        self.ready_drafts: torch.Tensor | None = None  # [B', γ] by slot
        self.ready_probs: torch.Tensor | None = None  # [B', γ, K]
        self.ready_gamma = 0
        self._pending: Future | None = None  # the `Ahead` being drafted
        self._proposed: torch.Tensor | None = None  # [n, γ] the last proposal's drafts, on the drafter's device
        self._keys: torch.Tensor | None = None  # [n] its rows' random-stream keys, there too
        self.rows_ahead = 0  # row-steps that drafted ahead (counters for the benchmark's report)
        self.rows_kept_ahead = 0  # ... whose work was kept

    @property
    def num_forwards(self) -> int:
        return self.inner.num_forwards

    # ------------------------------------------------------------------ drafting

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """Each row's drafts: kept from ahead where the last step's post-verify kept them, drafted now elsewhere."""
        if self._pending is not None:  # a step that raised after drafting ahead: its work is not this step's
            self._pending.result()
            self._pending = None
            self._forget()
        n = live.stop
        local = self._local(rows, n)
        ready = [b for b in range(n) if self.ready[b]]
        if ready and gamma > self.ready_gamma:  # more drafts than were drafted ahead: draft them all now
            self._roll_back(ready, [rows.host_seq_len[b] - 1 for b in ready])
            ready = []
        if not ready:
            draw = self._draw(draw, local, live, gamma, params)
            out = self._run(self.inner.propose, live, local, gamma, params, draw)
            drafts, probs = out.drafts, out.q.probs
        else:
            # The kept cache holds e_1 … e_γ' past the row's last token: a proposal of γ ≤ γ' feeds up to e_γ.
            self._roll_back(ready, [rows.host_seq_len[b] + gamma - 1 for b in ready])
            index = torch.tensor(ready, device=self.device)
            drafts = torch.empty(n, gamma, dtype=torch.long, device=self.device)  # [n, γ]
            probs = self.ready_probs.new_empty(n, gamma, self.ready_probs.shape[-1])  # [n, γ, K]
            drafts[index], probs[index] = self.ready_drafts[index, :gamma], self.ready_probs[index, :gamma]
            fresh = sorted(set(range(n)) - set(ready))
            if fresh:
                some = RowIds.of(fresh, self.device)
                out = self._run(self.inner.propose, some, local, gamma, params,
                                self._draw(draw, local, some, gamma, params))
                drafts[some.index], probs[some.index] = out.drafts, out.q.probs
        self.ready[:n] = [False] * n
        self._proposed, self._keys = drafts, local.keys[:n]
        ids = self.inner.draws.ids
        return Proposal(drafts.to(self.target_device), DraftQ.over(
            probs.to(self.target_device), None if ids is None else ids.to(self.target_device),
            self.inner.target_vocab_size))

    def draft_ahead(self, live: slice, rows: RowBuffers, params: SamplingParams) -> None:
        """Start drafting the next step of every live row, as if this step keeps all its drafts (module docstring),
        on the drafter's thread; `keep` takes it. Called between the proposal and the target's forward: the rows'
        lengths are still the step's starting ones."""
        gamma = self._proposed.shape[1]
        n = live.stop
        # From the host and the keys `propose` copied: no device→host copy on the target's path.
        start = torch.tensor(rows.host_seq_len[:n], device=self.device) + gamma  # where the token after d_γ goes
        noise = StepNoise(self._keys, start, gamma + 1, self.inner.target_vocab_size, params.greedy)
        last = self._proposed[:, -1:]  # [n, 1] d_γ: drawn, never fed
        self._pending = self.thread.submit(self._ahead, live, last, gamma, params, noise)
        self.rows_ahead += n

    def _ahead(self, live: slice, last: torch.Tensor, gamma: int, params: SamplingParams, noise: StepNoise) -> Ahead:
        out = self.inner.draft_on(live, last, gamma + 1, params, noise.draw_draft)
        return Ahead(gamma, out.drafts, out.q.probs, out.drafts[:, 0].tolist())

    # ------------------------------------------------------------------ after the step

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Post-verify: rows that kept every draft and drew e_1 keep what was drafted ahead; every other row rolls back
        to its kept prefix (`ModelDrafter.keep`'s rule, from the step's host copy)."""
        step = rows.last_step
        ahead = self._pending.result() if self._pending is not None else None
        self._pending = None
        kept = [False] * len(step.seq_len)
        if ahead is not None:
            g = ahead.gamma
            kept = [d == g and a == g and len(new) > g and new[g] == guess
                    for d, a, new, guess in zip(step.drafted_len, step.accepted_len, step.appended, ahead.guess)]
            self.ready_drafts, self.ready_probs, self.ready_gamma = ahead.drafts[:, 1:], ahead.probs[:, 1:], g
            self.rows_kept_ahead += sum(kept)
        lens = self.inner.runner.host_lens(live)
        back = [b for b, hit in enumerate(kept) if not hit]
        self._roll_back(back, [min(lens[b], step.seq_len[b] + step.accepted_len[b]) for b in back])
        self.ready[: len(kept)] = kept

    def _roll_back(self, slots: list[int], host_lens: list[int]) -> None:
        if slots:
            self.inner.runner.rollback(RowIds.of(slots, self.device), torch.tensor(host_lens, device=self.device),
                                       host_lens)

    def prefill(self, slots: Rows, rows: RowBuffers, count: torch.Tensor) -> None:
        ids = host_ids(slots, len(self.ready))
        for slot in ids:
            self.ready[slot] = False
        if self.device == self.target_device:
            self._run(self.inner.prefill, slots, rows, count)
            return
        local = LocalRows(rows.tokens.to(self.device), rows.seq_len.to(self.device), rows.keys.to(self.device),
                          rows.host_seq_len, rows.last_step)
        self._run(self.inner.prefill, RowIds.of(ids, self.device), local, count.to(self.device))

    def move_row(self, src: int, dst: int) -> None:
        self.inner.move_row(src, dst)
        self.ready[dst], self.ready[src] = self.ready[src], False
        if self.ready[dst]:
            self.ready_drafts[dst], self.ready_probs[dst] = self.ready_drafts[src], self.ready_probs[src]

    # ------------------------------------------------------------------ the rest of the protocol: the inner drafter's

    def release(self) -> None:
        self._forget()
        self.inner.release()

    def allocate(self) -> None:
        self.inner.allocate()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.inner.load_weights(state_dict)

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self._forget()  # drafts ahead are over the old vocabulary's ids
        self.inner.set_draft_vocab(vocab)

    def draft_vocab(self) -> torch.Tensor | None:
        return self.inner.draft_vocab()

    def cost_key(self) -> str:
        cores = "" if not self.placement.splits_cores else f":cores{len(self.thread.cores)}"
        return self.inner.cost_key() + f":on-{self.device}{cores}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Timed where the drafts run: on the drafter's thread (its cores)."""
        return self._run(self.inner.time_drafts, batch_sizes, deadline)

    def close(self) -> None:
        """Stop the drafter's thread now (a dropped engine's drafter stops it when collected)."""
        if self.thread is not None:
            self.thread.close()

    # ------------------------------------------------------------------ helpers

    def _forget(self) -> None:
        self.ready = [False] * len(self.ready)

    def _run(self, fn, *args):
        return fn(*args) if self.thread is None else self.thread.run(fn, *args)

    def _local(self, rows: RowBuffers, n: int) -> RowBuffers | LocalRows:
        """The live rows as the drafter reads them: `rows` itself on the same device, else a copy of the first n."""
        if self.device == self.target_device:
            return rows
        return LocalRows(rows.tokens[:n].to(self.device), torch.tensor(rows.host_seq_len[:n], device=self.device),
                         rows.keys[:n].to(self.device), rows.host_seq_len, rows.last_step)

    def _draw(self, draw: DraftDraw, local: RowBuffers | LocalRows, live: Rows, gamma: int,
              params: SamplingParams) -> DraftDraw:
        """The draw of `live`'s drafts: the engine's (its noise) on its device, else one with this device's copy of
        the same noise."""
        if self.device == self.target_device:
            return draw if isinstance(live, slice) else functools.partial(draw, rows=live.index)
        index = device_index(live)
        return StepNoise(local.keys[index], local.seq_len[index], gamma + 1, self.inner.target_vocab_size,
                         params.greedy).draw_draft


def place_drafter(drafter: object, config: EngineConfig, target: ModelRunner) -> Drafter | None:
    """The engine's drafter: `factory.make_drafter`'s, unless `config` places it (`drafter_device`) or drafts ahead
    (`overlap`): then the drafter LM in an `AheadDrafter` (other kinds refused, naming the ones served)."""
    if config.drafter_device is None and not config.overlap:
        return make_drafter(drafter, config, target)
    kinds = config.drafters or (("model",) if isinstance(drafter, PreTrainedModel) else (type(drafter).__name__,))
    if tuple(kinds) != PLACED_KINDS or not isinstance(drafter, PreTrainedModel):
        raise ValueError(f"drafter_device={config.drafter_device!r} / overlap={config.overlap!r} are invalid with "
                         f"drafters {tuple(kinds)}: they serve {PLACED_KINDS} (a drafter LM passed to SpecEngine) only")
    placement = parse_drafter_device(config.drafter_device or str(target.device))
    inner = ModelDrafter(drafter, config.max_batch_size, config.cache_len, config.dtype, placement.device,
                         target.vocab_size, config.lean_forward, config.state_history, config.prefill_chunk_tokens)
    thread = target_cores = None
    if placement.splits_cores:
        drafter_cores, cores = placement.split()
        thread = DrafterThread(drafter_cores)
        target_cores = TargetCores(cores, thread)
    elif config.overlap:
        thread = DrafterThread(None)
    return AheadDrafter(inner, placement, target.device, thread, target_cores)
