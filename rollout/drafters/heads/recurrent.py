"""RecurrentHead: the ReDrafter draft head (Cheng et al. 2024, arXiv 2403.09919) — one recurrent layer on the target.

The target's newest hidden state h (final-normed: `lm_head(h)` is its logits for the row's last token) is the
context of every draft of a step. A state s carries what was drafted since: s_0 = h, and each token x fed
updates it, s' = SiLU(W·embed(x) + U·s + b) (`cell`, the target's frozen embedding); the readout of a state is
`input_proj([h ‖ s])` through `mlp_layers` residual blocks x + SiLU(A·x + c) (`readout`), and its LM-head logits are
q of the next token. So a step feeds the row's last token (the one h predicted) to get q of the first draft, and
each draft to get the next q: one small matrix-vector product per draft, no cache, nothing to roll back.

The LM head is the target's (frozen, shared) or the head's own over `draft_ids` (sorted target ids: a draft
vocabulary of its own, trained with it). A fresh head reads out h itself: `input_proj` starts as [I 0] and the
residual blocks at zero, so its first q is the target's own distribution at h (Medusa's start, `medusa.MedusaHeads`),
and training moves it to the next token. `depths`: the draft depths the online learner trains and scores it at
(the recurrence unrolled over the real tokens, `online_drafter.heads.objectives.RecurrentObjective`).

Departs from ReDrafter: its state starts at zero and h enters only the readout; here the state starts at h (the
issue's design: the recurrence starts from the target's state; h still enters every readout, so nothing of
ReDrafter's is lost), and the readout's LM head may be the target's instead of a full-vocabulary one of its own.
Used by `drafters.recurrent.RecurrentDrafter` (chains and beam-search trees) and trained by the head learner on the
same math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    """x + SiLU(A·x + c): ReDrafter's (and Medusa's) residual block; A and c start at zero (the identity)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class RecurrentHead(nn.Module):
    def __init__(self, hidden_size: int, mlp_layers: int = 2, depths: int = 3, draft_ids: torch.Tensor | None = None):
        """`hidden_size`: the target's H (the state's width too); `mlp_layers` residual blocks in the readout;
        `depths`: the draft depths trained and scored; `draft_ids` [N]: increasing target ids of an own LM head's
        rows (None: it drafts through the target's LM head)."""
        super().__init__()
        if not (isinstance(mlp_layers, int) and mlp_layers >= 0):
            raise ValueError(f"recurrent mlp_layers={mlp_layers!r} is invalid: an int >= 0")
        if not (isinstance(depths, int) and depths >= 1):
            raise ValueError(f"recurrent depths={depths!r} is invalid: an int >= 1")
        self.depths = depths
        self.rnn_w = nn.Linear(hidden_size, hidden_size, bias=False)  # the token's embedding into the state
        self.rnn_u = nn.Linear(hidden_size, hidden_size)  # the state into the next
        self.input_proj = nn.Linear(2 * hidden_size, hidden_size)  # [h ‖ s] → the readout's width
        with torch.no_grad():
            self.input_proj.weight.zero_()
            self.input_proj.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
            self.input_proj.bias.zero_()
        self.blocks = nn.ModuleList(ResidualBlock(hidden_size) for _ in range(mlp_layers))
        if draft_ids is not None:
            draft_ids = torch.as_tensor(draft_ids, dtype=torch.long)
            if draft_ids.dim() != 1 or draft_ids.numel() < 1 or not bool((draft_ids[1:] > draft_ids[:-1]).all()):
                raise ValueError("recurrent draft_ids must be a non-empty 1-D tensor of increasing target ids")
        self.lm_head = None if draft_ids is None else nn.Linear(hidden_size, draft_ids.numel(), bias=False)
        # int64 [N] or None, not in the state dict (as `eagle3.Eagle3Head.draft_ids`): a drafter version is its
        # parameters; the ids come with the head's construction (`drafters.recurrent.fresh_head`).
        self.register_buffer("draft_ids", draft_ids, persistent=False)

    @classmethod
    def for_target(cls, config, mlp_layers: int = 2, depths: int = 3, draft_ids: torch.Tensor | None = None,
                   seed: int = 0) -> RecurrentHead:
        """A fresh head for a target of this config (its hidden size), seeded."""
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(config.get_text_config().hidden_size, mlp_layers, depths, draft_ids)

    @property
    def hidden_size(self) -> int:
        return self.rnn_u.weight.shape[0]

    def cell(self, state: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The next state [..., H] from the state [..., H] and the fed token's embedding [..., H]."""
        return F.silu(self.rnn_w(embeds) + self.rnn_u(state))

    def readout(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """What the LM head reads [..., H] from the context h [..., H] and a state [..., H]."""
        x = self.input_proj(torch.cat([hidden, state], dim=-1))
        for block in self.blocks:
            x = block(x)
        return x
