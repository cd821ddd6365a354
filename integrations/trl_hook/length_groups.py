"""The policy update over groups of similar-length completions: TRL's `GRPOTrainer` without the long tail's padding.

TRL pads a step's completions to the longest one and runs the policy's forward and backward over the whole
`[B, prompt + longest]` batch. GRPO's completions are long-tailed, so most of that work is padding: in the
subword demo one 320-token completion among 31 of ~60 makes the update ~4x the real tokens' work. A trainer
with `LengthGroupedLogps` mixed in computes the per-token log-probs (and entropies) of rows sorted by completion
length, in groups each cut to its own longest completion (`length_groups` picks the groups), and puts them back
in TRL's order, zeros at the padding TRL masks anyway — so the loss, its gradient and every logged metric are
TRL's (up to float rounding: the same sums over other matmul shapes), for less work.

Only the right (completion) padding is cut: the left-padded prompt columns stay, so every token keeps its
position. Steps TRL runs with multimodal inputs or a MoE auxiliary loss take TRL's own path, and so does a run
sharded over several ranks by DeepSpeed ZeRO-3 or FSDP: there every forward gathers the parameters collectively,
so the ranks must run as many forwards as each other, and each rank's groups follow its own completions.

    from trl import GRPOTrainer
    from specroll.integrations.trl_hook import length_grouped
    trainer = length_grouped(GRPOTrainer)(model=..., rollout_func=...)   # or `specroll train`'s default
"""

from __future__ import annotations

from typing import Any

import torch

# What one more group costs beside its tokens, in token-rows: a forward's fixed work (kernel launches, the
# optimizer-free per-call overhead of the model's modules) — a group of a few short rows is not worth it.
GROUP_OVERHEAD_TOKENS = 64


def length_groups(widths: list[int], prompt: int, max_rows: int | None = None,
                  overhead: int = GROUP_OVERHEAD_TOKENS) -> list[list[int]]:
    """Row indices in groups: the rows sorted by `widths` (completion columns each needs; longest first) and
    cut into consecutive groups of at most `max_rows` that minimize the work Σ rows · (`prompt` + the group's
    longest width) + `overhead` per group (exactly, by dynamic programming over the cut points)."""
    if not widths:
        return []
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    count, cap = len(order), max_rows or len(order)
    if cap < 1:
        raise ValueError(f"max_rows={max_rows} is invalid: a group holds at least one row")
    best, cut = [0] + [None] * count, [0] * (count + 1)
    for end in range(1, count + 1):
        for start in range(max(0, end - cap), end):
            work = best[start] + (end - start) * (prompt + widths[order[start]]) + overhead
            if best[end] is None or work < best[end]:
                best[end], cut[end] = work, start
    groups, end = [], count
    while end:
        groups.append(order[cut[end]:end])
        end = cut[end]
    return groups[::-1]


class LengthGroupedLogps:
    """Mix into `trl.GRPOTrainer` (before it) to run its per-token log-prob forwards over `length_groups`."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **inputs: Any):
        whole = super()._get_per_token_logps_and_entropies  # type: ignore[misc]
        if compute_aux_loss or any(value is not None for value in inputs.values()) or sharded_forward(self):
            if compute_aux_loss:  # passed only when asked for: TRL releases before it do not take it
                inputs["compute_aux_loss"] = compute_aux_loss
            return whole(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                         compute_entropy=compute_entropy, **inputs)
        prompt = input_ids.shape[1] - logits_to_keep
        columns = torch.arange(1, logits_to_keep + 1, device=attention_mask.device)
        widths = (attention_mask[:, prompt:] * columns).amax(dim=1).clamp(min=1).tolist()  # last real column + 1
        groups = length_groups(widths, prompt, batch_size)
        if len(groups) == 1 and widths[groups[0][0]] == logits_to_keep:
            return whole(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                         compute_entropy=compute_entropy)
        logps, entropies = [], []
        for rows in groups:
            width, index = widths[rows[0]], torch.tensor(rows, device=input_ids.device)
            part_logps, part_entropies, _ = whole(model, input_ids[index, : prompt + width],
                                                  attention_mask[index, : prompt + width], width,
                                                  compute_entropy=compute_entropy)
            logps.append(torch.nn.functional.pad(part_logps, (0, logits_to_keep - width)))
            if compute_entropy:
                entropies.append(torch.nn.functional.pad(part_entropies, (0, logits_to_keep - width)))
        order = torch.tensor([row for rows in groups for row in rows], device=input_ids.device)
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order), device=order.device)
        return torch.cat(logps)[back], (torch.cat(entropies)[back] if compute_entropy else None), None


def sharded_forward(trainer: Any) -> bool:
    """Whether `trainer`'s forwards are collective across several ranks (DeepSpeed ZeRO-3, FSDP)."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return False
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return bool(getattr(trainer, "is_fsdp_enabled", False) or (plugin is not None and plugin.zero_stage == 3))


def length_grouped(trainer_class: type) -> type:
    """`trainer_class` (a `GRPOTrainer`) with `LengthGroupedLogps` mixed in."""
    return type(f"LengthGrouped{trainer_class.__name__}", (LengthGroupedLogps, trainer_class), {})
