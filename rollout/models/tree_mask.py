"""Tree attention: which cached slots each query of a forward over a token tree sees (`TreeAttention`).

A tree forward feeds several candidate continuations of a row at once (`sampling.draft_tree`). Its nodes are
written to consecutive slots from `region_start` on, in node order; a node must see the row's context
(every slot before the region) and its own ancestors and itself among the region's slots — never a
sibling's branch. Its rotary position is the context length plus its depth, not its slot, so the runner
feeds `positions` to the model and keeps the slots for the writes (`ModelRunner.forward(tree=...)`).

A sliding window compares sequence positions, and a region slot's position is its node's (`slot_positions`),
not its slot index. Recurrent (linear-attention, SSM) layers fold tokens in order into one state per row: a
tree has no single order, so the runner refuses a tree forward on a model with such layers (`check_tree`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TreeAttention:
    """The tree of one forward, for its n rows and Q queries over a region of T slots."""

    region_start: torch.Tensor  # [n] first slot of the tree region; the row's context is the slots before it
    ancestors: torch.Tensor  # [n, Q, T] bool: query q sees region slot t (its ancestors and itself)
    positions: torch.Tensor  # [n, Q] each query's sequence position (context length + depth)
    slot_positions: torch.Tensor  # [n, T] the sequence position of each region slot's node

    def visible(self, kv_len: int, window: int | None) -> torch.Tensor:
        """[n, Q, K] bool: query q of row b sees slot k (context, or an ancestor; within `window` positions)."""
        n, q_len, size = self.ancestors.shape
        slots = torch.arange(kv_len, device=self.positions.device)[None, :]  # [1, K]
        rel = slots - self.region_start[:, None]  # [n, K] slot index inside the region (< 0: context)
        inside = (rel >= 0) & (rel < size)
        at = rel.clamp(0, size - 1)  # [n, K]
        seen = self.ancestors.gather(2, at[:, None, :].expand(n, q_len, kv_len))  # [n, Q, K]
        visible = (rel < 0)[:, None, :] | (inside[:, None, :] & seen)
        if window is not None:
            slot_pos = torch.where(rel < 0, slots, self.slot_positions.gather(1, at))  # [n, K]
            visible &= slot_pos[:, None, :] > self.positions[:, :, None] - window
        return visible


def check_tree(model_type: str, has_state_layers: bool, role: str) -> None:
    """Raise `ValueError` if a model cannot score a tree in one forward (recurrent layers: see the docstring)."""
    if has_state_layers:
        raise ValueError(f"{role} model_type {model_type!r} keeps recurrent (linear-attention/SSM) state, which "
                         "folds tokens in one order per row: a token tree cannot be scored in one forward. Use "
                         "tree_width=1 (chains) with this model")
