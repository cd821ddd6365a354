"""The `Drafter` protocol: what the engine asks of anything that proposes drafts, and the `Proposal` it returns.

A drafter proposes up to γ tokens for every live row together with the distribution q each was drawn
from (verification needs q), is told after the step which tokens the rows kept, and follows the
scheduler's row moves and prefills. It reports what its drafts cost (`time_drafts`, for auto-γ's cost
model) and whether it has weights the learner can update (`trainable`). The engine takes any object
with these methods (the drafters here subclass `Drafter` for its defaults: `learnt_state`): `model.ModelDrafter`
(an independent LM, the default), `suffix.SuffixDrafter` (model-free, over sibling and earlier completions),
`suffix_or_model.SuffixOrModelDrafter` (a per-row choice between them), and the drafters that read the target
(`layer_skip.LayerSkipDrafter`, `eagle.EagleDrafter`, `medusa.MedusaDrafter`; the last two ask for its hidden
states: `wants_hidden`, `hidden`). `factory.make_drafter` builds what `EngineConfig.drafters` lists.

A drafter may also propose a *tree* of candidates (`TreeDrafter.propose_tree`: several children per node, by
its own confidence; `sampling.draft_tree.DraftTree` is the shape). Chains stay the common case: the engine asks for a
tree only where the γ policy's tree shape says one pays (`gamma.tree_shape`), and only of a drafter that implements
`TreeDrafter` (`model.ModelDrafter`, `suffix_or_model.SuffixOrModelDrafter`); `propose` is untouched.

A drafter owns no randomness: it draws each draft with the `draw(q_i, i)` the engine hands it —
Gumbel-max with the token noise of that row and position (`sampling.noise.StepNoise.draw_draft`), the noise
the target's own draw there uses. That shared noise is what makes the invariant rule's output
independent of the drafter. A drafter whose q is a point mass (the suffix drafter) needs no draw.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from ..config import SamplingParams
from ..core.batch import RowBuffers
from ..models.cache import LayerShape
from ..models.timing import ForwardTimes
from ..sampling.draft_q import DraftQ
from ..sampling.draft_tree import DraftTree
from ..sampling.noise import StepNoise
from .draft_vocab import DraftVocab

# draw(q_i [n, K], i, ids=None, rows=None) → draft i [n] (target ids), with the token noise of each row's position
# of draft i: K = V, or q over a draft vocabulary's target ids `ids` [K]; `rows` [n] the live rows q is for (None:
# all of them). `sampling.noise.StepNoise.draw_draft`.
DraftDraw = Callable[..., torch.Tensor]


@dataclass
class Proposal:
    drafts: torch.Tensor  # [n, γ] int64
    # The drafter's processed probabilities the drafts were drawn from, as compact as known (over the whole
    # vocabulary, a draft vocabulary, or point masses: `sampling.draft_q.DraftQ`); NaN where its logits were
    # non-finite (`process_logits`): the engine then drops that row's drafts for the step.
    q: DraftQ
    # [n] drafts each row proposes (≤ γ; the rest are padding, never kept). None: all γ.
    lengths: torch.Tensor | None = None
    # [n] which of the drafter's `names` proposed each row (for per-drafter stats). None: all names[0].
    source: torch.Tensor | None = None
    # Host, [γ+1]: the drafts expected kept, all rows together, if only the first w columns are verified
    # (w = 0..γ). Given, an adaptive γ policy may verify fewer columns (`GammaPolicy.narrow`).
    expected_kept: list[float] | None = None
    # A tree proposal: `drafts` [n, M] and q [n, M, K] are its drafted nodes, level by level (`DraftTree`); the
    # engine verifies it with one tree forward (`step.tree`). None: a chain.
    tree: DraftTree | None = None

    def narrow(self, width: int) -> Proposal:
        """The chain proposal's first `width` columns (itself if it is no wider)."""
        if width >= self.drafts.shape[1]:
            return self
        lengths = None if self.lengths is None else self.lengths.clamp_max(width)
        return Proposal(self.drafts[:, :width], self.q.narrow(width), lengths, self.source)

    def usable(self, gamma: int) -> torch.Tensor:
        """[n, γ] bool: the drafts verification may keep — each row's proposed ones, none of a row whose
        q is non-finite anywhere (it takes a plain step)."""
        n, device = self.drafts.shape[0], self.drafts.device
        usable = self.q.finite_rows(n, device)[:, None].expand(n, gamma)  # [n, γ]
        if self.lengths is not None:
            usable = usable & (torch.arange(gamma, device=device) < self.lengths[:, None])
        return usable


@dataclass(frozen=True)
class DrafterMemory:
    """What a drafter needs before it is built (`models.memory.plan_memory`): its own cache's layer shapes (None: no
    cache of its own), its weights' bytes, and the width per position of the target's states it reads (None: none)."""

    cache_shapes: list[LayerShape] | None = None
    weight_bytes: int = 0
    hidden_width: int | None = None


class Drafter(Protocol):
    names: tuple[str, ...]  # the kinds this drafter reports stats under (one, or one per sub-drafter)
    trainable: bool  # has weights `load_weights` can replace (the online learner's target)
    # reads the target's hidden states from verification (`RowBuffers.hidden`, kept only when asked)
    wants_hidden: bool
    num_forwards: int  # model forwards run so far

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """Up to γ drafts for each of the live rows (rows.tokens[:, :seq_len] is each row's text). The
        proposal may be narrower than γ (no row's drafts past its width were worth verifying): the step
        then verifies that width."""
        ...

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """After a step: `rows` holds the kept tokens; `seq_len` [n] the lengths before the step,
        `drafted_len` [n] the drafts of this drafter's proposal that were verified and `accepted_len` [n]
        those kept (0 where it proposed none)."""
        ...

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """New requests in `slots` [k] (their prompts in `rows`); `count` [k] prompt tokens to feed now."""
        ...

    def move_row(self, src: int, dst: int) -> None: ...

    def release(self) -> None:
        """Free its per-row memory (KV cache) between rollout phases (`SpecEngine.release`); weights stay."""
        ...

    def allocate(self) -> None:
        """Make what `release` freed again, empty (a no-op where it exists)."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """New weights (parameter name → tensor, all or some of them); the draft vocabulary is `set_draft_vocab`'s."""
        ...

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft over `vocab`'s ids only (None: the whole vocabulary). A drafter without an LM head (suffix)
        ignores it."""
        ...

    def draft_vocab(self) -> torch.Tensor | None:
        """The target ids it drafts over now (None: the whole vocabulary, or no LM head)."""
        ...

    def cost_key(self) -> str:
        """What the drafts' cost depends on (model shape, layout, ...), for the calibration cache."""
        ...

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Seconds of one draft per batch size at query lengths [1, 2] (a draft after a catch-up of up
        to two tokens costs the second column, each further draft the first)."""
        ...

    def learnt_state(self) -> dict[str, Any]:
        """What it learnt from the rollouts it served, by part, for a resumed run (`SpecEngine.state_dict`; not its
        weights: the learner publishes those). A drafter that learns nothing from them keeps this default: {}."""
        return {}

    def load_learnt_state(self, state: dict[str, Any]) -> None:
        """Take back a `learnt_state()` (between `generate` calls; the engine checks the parts match)."""


@runtime_checkable
class TreeDrafter(Drafter, Protocol):
    """A `Drafter` that can also propose a tree (module docstring); the engine checks for it once, at construction."""

    tree_ready: bool  # False: it cannot draft a tree now (e.g. a recurrent drafter LM): the engine refuses trees

    def propose_tree(self, live: slice, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """A tree of `depth` levels of `width` nodes for each live row (`Proposal.tree`), each node drawn with the
        token noise of its depth (`StepNoise.draw_top`: Gumbel-top-k, the chain's draft first)."""
        ...
