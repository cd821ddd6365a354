"""Eagle3Drafter: the EAGLE-3 head (`heads.eagle3.Eagle3Head`) drafting over fused target features.

The drafting loop, its one-layer ragged cache and its rollback are `eagle.EagleDrafter`'s (pairs at
positions t, caught up from verification's states, rolled back to the real pairs after each step); what
differs is what the pairs hold. The target's runner writes the residual stream entering the head's
`target_layers` into `RowBuffers.hidden` ([B, L, k·H], `ModelRunner.capture_hidden`, set by the factory — no
second target forward), so a real pair's feature is `fc` of those k states; a pair past the kept text feeds
the head's own previous output o (pre-norm, as vLLM and SGLang feed EAGLE-3). q is the LM head over `norm(o)`:
the target's LM head (over `engine.draft_vocab` if set), or the head's own over its `draft_ids` (the public
checkpoints' `d2t`; a set draft vocabulary then keeps the ids both share). Lossless either way: verification
is unchanged, q is exactly what each draft was drawn from.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import EngineConfig
from ..models.cache import LayerShape
from ..models.memory import module_bytes
from ..models.runner import ModelRunner
from .draft_vocab import VocabDraws
from .eagle import EagleDrafter
from .heads.eagle3 import Eagle3Head
from .protocol import DrafterMemory


class Eagle3Drafter(EagleDrafter):
    weights_role = "eagle3 head"
    names = ("eagle3",)

    def __init__(self, head: Eagle3Head, embed: nn.Module, lm_head: nn.Module, slots: int, length: int,
                 dtype: torch.dtype, device: torch.device):
        """`embed`, `lm_head`: the target's (its LM head drafts unless `head` has its own)."""
        if head.hidden_size != embed.weight.shape[1]:
            raise ValueError(f"eagle3 head hidden_size={head.hidden_size} does not match the target's "
                             f"hidden_size={embed.weight.shape[1]}")
        super().__init__(head, embed, lm_head if head.lm_head is None else head.lm_head, slots, length, dtype, device)
        own_ids = None if head.draft_ids is None else self.head.draft_ids
        if own_ids is not None and int(own_ids[-1]) >= lm_head.weight.shape[0]:
            raise ValueError(f"eagle3 draft_ids reach target id {int(own_ids[-1])}: the target's vocabulary has "
                             f"{lm_head.weight.shape[0]} ids")
        self.draws = VocabDraws(lm_head.weight.shape[0], own_ids)

    def _run_head(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                  real: bool) -> torch.Tensor:
        """Real pairs carry the target's captured states [n, Q, k·H], fused first; others the head's own o."""
        hidden = self.head.fuse(features) if real else features
        return self.head(embeds, hidden, positions, self.cache.layers[0].update, mask)

    def _draft_input(self, out: torch.Tensor) -> torch.Tensor:
        return self.head.final(out)

    def cost_key(self) -> str:
        head = self.head
        return (f"eagle3:{head.target_layers}:{head.fc.weight.shape}:{head.gate_proj.weight.shape}:"
                f"{head.num_heads}/{head.num_kv_heads}:{head.fc.weight.dtype}:{self.lm_head.weight.shape}:"
                f"draft_vocab{self.draws.width}")


def fresh_head(config: EngineConfig, target_config) -> Eagle3Head:
    """A fresh EAGLE-3 head for the target: `config.eagle3_layers` (None: low / middle / high), the target's MLP
    width, `config.eagle3_ttt_steps` depths, the target's LM head."""
    return Eagle3Head.for_target(target_config, config.eagle3_layers, ttt_steps=config.eagle3_ttt_steps)


def build(head: Eagle3Head | None, config: EngineConfig, target: ModelRunner) -> Eagle3Drafter:
    """The "eagle3" kind (`registry`): `head` (None: a fresh one); verification captures its target layers."""
    model = target.model
    head = head if head is not None else fresh_head(config, model.config)
    target.capture_hidden(head.target_layers)
    return Eagle3Drafter(head, model.get_input_embeddings(), model.get_output_embeddings(), config.max_batch_size,
                         config.cache_len, config.dtype, target.device)


def memory(head: object, config: EngineConfig, target) -> DrafterMemory:
    """Its one-layer cache, its weights and the target layers' states it fuses per position."""
    head = head if isinstance(head, Eagle3Head) else fresh_head(config, target.config)
    return DrafterMemory([LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)],
                         module_bytes(head, config.dtype),
                         target.config.get_text_config().hidden_size * len(head.target_layers))
