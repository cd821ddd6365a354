"""The tree shape of a step: how many nodes per level (`width`) and how many levels (`depth`) to verify.

`FixedWidth` (`EngineConfig.tree_width` = w ≥ 2): every speculative step is a tree of γ levels of w nodes.

`AutoWidth` (`tree_width="auto"`, with `gamma="auto"`): after `auto.AutoGamma` has chosen the chain's γ, every
(depth d, width w ≥ 2) is weighed against that chain by expected tokens per second:

    E[tokens of a row | d, w] = 1 + Σ_{k=1..d} Π_{j<k} a_j(w) (1 - h)
    time(d, w, n) = the chain step's predicted time at γ = d  (cost model, corrected online)
                    + target forward(n, 1 + d·w) − target forward(n, 1 + d)     (the wider verification)
                    + d · drafter's slow-down · (draft(n, w) − draft(n, 1))   (each level feeds w nodes)
                    + d · a per-level offset learnt from the tree steps run at width w

with h the measured share of tokens that end their row (auto-γ's), and a_j(w) the chance that some child is kept
at depth j + 1 of the path given the path so far, counted from the tree steps run at width w (decayed like the
chains' counts) and pulled toward 1 − (1 − α_j)^√w (α_j the chain's per-position acceptance: siblings drawn
without replacement are not independent tries, hence √w tries) by `PRIOR_DRAFTS` pseudo-drafts. A tree wins when
its rate beats the chain's by `TREE_MARGIN` — judged only once a tree has run at a live batch within a factor 2
(a per-level offset measured there; an unmeasured width takes the nearest measured one's): where trees are
predicted to win on the prior alone, one shallow tree (`PROBE_DEPTH` levels) runs first. (Without it, on the demo
models at a full batch of 16, a 6 × 2 tree predicted at 0.30 s ran 0.46 s, each width's probe cost 3-4 chain steps.)

Both sides are only measured while they run, and each side's prediction is corrected from its own steps alone (the
chain's by auto-γ's cost model and acceptance counts, the tree's by its offset and a_j(w)). So neither may starve:
the first step of a mode is a chain (auto-γ's first step measures α at every position: the chain the trees are
weighed against, and their prior, start from a measurement), every `EXPLORE_EVERY` chain steps the best tree runs
if it is predicted within `EXPLORE_WITHIN` of the chain, and every `EXPLORE_EVERY` tree steps the chain runs. (With
trees only, a chain mispredicted once — a calibration taken on a busy machine — stayed mispredicted: measured on the
demo models, trees then ran on 88% of full-batch steps at 0.59× the chains' speed.) Where a forward of more tokens
per row costs more — a full batch — the wider verification does not pay and the step stays a chain; where the batch
has drained it costs about the same, and the tree's longer kept path wins.
"""

from __future__ import annotations

import math

from ..core.rates import DecayedRates
from .auto import AutoGamma
from .policy import StepShape

PRIOR_DRAFTS = 4.0  # weight of a_j(w)'s prior, in drafts
TREE_MARGIN = 0.03  # a tree must be predicted this much faster than the chain
OFFSET_EMA = 0.8
PROBE_DEPTH = 2  # levels of the first tree run near a batch size (its cost measured before deeper ones are judged)
EXPLORE_EVERY = 32  # chain steps between probes of the best tree, and tree steps between runs of the chain
EXPLORE_WITHIN = 0.8  # ... a tree probed only if predicted to reach this fraction of the chain's rate


class FixedWidth:
    """Always a tree of `width` nodes per level, γ levels deep (the γ policy's γ)."""

    def __init__(self, width: int):
        self.width = width

    def choose(self, shape: StepShape, gamma: int, greedy: bool) -> tuple[int, int]:
        """(depth, width) of the step; width 1 is the chain of γ."""
        return gamma, self.width if gamma else 1

    def observe(self, shape: StepShape, depth: int, width: int, accepted_len: list[int], tried_len: list[int],
                seconds: float, greedy: bool) -> None:
        return None


class AutoWidth:
    """The tree shape chosen by the cost model (module docstring), beside `auto`'s γ."""

    def __init__(self, auto: AutoGamma, max_width: int, decay: float):
        self.auto, self.max_width, self.decay = auto, max_width, decay
        self.rates = {greedy: {w: DecayedRates(auto.max_gamma) for w in range(2, max_width + 1)}
                      for greedy in (True, False)}
        self.offsets: dict[tuple[int, int], float] = {}  # (live rows, width) → (measured − predicted seconds) / depth
        self.chain_steps = 0
        self.tree_steps = 0

    def expected_tokens(self, depth: int, width: int, greedy: bool) -> float:
        """E[tokens of a row] of a tree of `depth` levels of `width` nodes (a kept token ends its row with the
        chains' measured stop rate h, as auto-γ counts it)."""
        estimate = self.auto.estimates[greedy]
        alpha, rates, keep = estimate.alpha, self.rates[greedy][width], 1.0 - estimate.stop_rate
        total, survive = 1.0, 1.0
        for j in range(depth):
            prior = 1.0 - (1.0 - alpha[min(j, len(alpha) - 1)]) ** math.sqrt(width)
            survive *= rates.rate(j, prior, PRIOR_DRAFTS) * keep
            total += survive
        return total

    def step_time(self, shape: StepShape, depth: int, width: int) -> float:
        """Predicted seconds of a tree step (module docstring)."""
        cost, rows = self.auto.cost, shape.rows
        chain = self.auto.step_times(rows, shape.context)[depth]
        verify = cost.verify_time(rows, 1 + depth * width, shape.context, positions=1 + depth) - cost.verify_time(
            rows, 1 + depth, shape.context)
        draft = (cost.draft_scale or 1.0) * depth * (cost.drafter(rows, width) - cost.drafter(rows, 1))
        return max(chain + verify + draft + depth * self.offset(rows, width), 1e-7)

    def offset(self, rows: int, width: int) -> float:
        """The measured extra seconds per level of a tree step of `width` at `rows` live rows: of the nearest batch
        size measured at that width, else of the nearest measured (batch size, width); 0 before any tree ran.
        Growing a tree costs per level (a drafter forward over w nodes, a top-k over each node's q), so a shallow
        tree's overhead is not a deep one's."""
        if not self.offsets:
            return 0.0
        same = [key for key in self.offsets if key[1] == width]
        return self.offsets[min(same or self.offsets, key=lambda k: (abs(k[0] - rows), abs(k[1] - width)))]

    def choose(self, shape: StepShape, gamma: int, greedy: bool) -> tuple[int, int]:
        if not gamma or not self.auto.estimates[greedy].any_seen:
            return gamma, 1  # plain; or the mode's first step: auto-γ's chain measures α first
        rows, top = shape.rows, self.auto.max_gamma
        chain = rows * self.auto.estimates[greedy].expected_tokens(gamma) / self.auto.step_times(rows, shape.context)[
            gamma]
        best, tree = 0.0, (gamma, 1)
        for width in range(2, self.max_width + 1):
            for depth in range(1, top + 1):
                rate = rows * self.expected_tokens(depth, width, greedy) / self.step_time(shape, depth, width)
                if rate > best:
                    best, tree = rate, (depth, width)
        if best > chain * (1 + TREE_MARGIN):
            if not self.measured(rows):  # predicted to win before any tree ran near this batch size: a shallow
                return min(tree[0], PROBE_DEPTH), tree[1]  # probe measures the per-level cost, then it is judged
            self.tree_steps += 1
            return (gamma, 1) if self.tree_steps % EXPLORE_EVERY == 0 else tree
        self.chain_steps += 1
        if self.chain_steps % EXPLORE_EVERY == 0 and best >= EXPLORE_WITHIN * chain:
            return tree
        return gamma, 1

    def measured(self, rows: int) -> bool:
        """Whether a tree ran at a live batch within a factor 2 of `rows` (a per-level time offset is known there)."""
        return any(rows <= 2 * b and b <= 2 * rows for b, _ in self.offsets)

    def observe(self, shape: StepShape, depth: int, width: int, accepted_len: list[int], tried_len: list[int],
                seconds: float, greedy: bool) -> None:
        """Fold one tree step in: per row, depth j was reached if its path kept j children and a candidate was
        tried there, kept if it kept j + 1; and the step's time against its prediction."""
        if width < 2:
            return
        rates = self.rates[greedy][width]
        rates.decay(self.decay)
        for kept, tried in zip(accepted_len, tried_len):
            for j in range(tried):
                rates.add(j, j < kept, 1)
        key = (shape.rows, width)
        predicted = self.step_time(shape, depth, width) - depth * self.offset(shape.rows, width)
        old = self.offsets.get(key)
        extra = (seconds - predicted) / depth
        self.offsets[key] = extra if old is None else OFFSET_EMA * old + (1 - OFFSET_EMA) * extra

    def state_dict(self) -> dict:
        """What it learnt from the tree steps run (a_j(w), offsets) and its counters, for a resumed run."""
        return {"rates": {str(greedy): {str(w): r.state_dict() for w, r in by_width.items()}
                          for greedy, by_width in self.rates.items()},
                "offsets": [[rows, width, extra] for (rows, width), extra in self.offsets.items()],
                "chain_steps": self.chain_steps, "tree_steps": self.tree_steps}

    def load_state_dict(self, state: dict) -> None:
        for greedy, by_width in self.rates.items():
            for width, rates in by_width.items():
                saved = state["rates"][str(greedy)].get(str(width))
                if saved is not None:
                    rates.load_state_dict(saved)
        self.offsets = {(int(rows), int(width)): float(extra) for rows, width, extra in state["offsets"]}
        self.chain_steps, self.tree_steps = int(state["chain_steps"]), int(state["tree_steps"])
