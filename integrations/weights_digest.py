"""A digest of a drafter's weights: the same bytes give the same digest wherever it is computed.

    digest = weights_digest(learner.published_state_dict(), wire_dtype=torch.bfloat16)   # on the learner
    served = weights_digest(served_drafter_tensors(drafter_module, engine), torch.bfloat16)  # on a worker

The learner and every rollout engine each compute the digest of the drafter they hold, where its weights are,
and the backend compares the two (`drafter_watch`): a worker is never trusted to serve the version it says it
serves. The digest is BLAKE2b over every tensor in sorted-name order: its name, shape, dtype and bytes. A
floating tensor is hashed in the wire dtype — the engine's, the dtype a weight sync sends it in
(`sync.protocol.pack_buckets`) — except the buffers the engine keeps fp32 (`FP32_BUFFER_SUFFIXES`), so an
fp32 learner and a bf16 engine holding the same published version agree. The draft vocabulary a drafter
version may carry (`draft_vocab.STATE_KEY`) is hashed as its sorted int64 ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from specroll.rollout.drafters.draft_vocab import STATE_KEY
from specroll.rollout.engine import ACCEPTANCE_STATE_KEY
from specroll.rollout.models.weights import FP32_BUFFER_SUFFIXES

DIGEST_BYTES = 16


def weights_digest(named_tensors: Mapping[str, torch.Tensor], wire_dtype: torch.dtype | None = None) -> str:
    """Hex BLAKE2b digest of `named_tensors` as a sync to an engine of `wire_dtype` would deliver them."""
    if not named_tensors:
        raise ValueError("named_tensors is empty: a digest of no weights checks nothing")
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    # a version's held-out acceptance (a cold start's tag, `engine.ACCEPTANCE_STATE_KEY`) is a measurement, not a weight
    for name in sorted(n for n in named_tensors if n != ACCEPTANCE_STATE_KEY):
        tensor = _as_delivered(name, named_tensors[name].detach(), wire_dtype)
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def served_drafter_tensors(drafter: torch.nn.Module, draft_vocab: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """What an engine serves of a drafter, named as the learner publishes it (`Learner.published_state_dict`):
    the module's parameters, and the draft vocabulary the engine drafts over (None: the whole vocabulary)."""
    named = dict(drafter.named_parameters())
    if draft_vocab is not None:
        named[STATE_KEY] = draft_vocab
    return named


def _as_delivered(name: str, tensor: torch.Tensor, wire_dtype: torch.dtype | None) -> torch.Tensor:
    if name == STATE_KEY:
        return torch.sort(tensor.to(torch.int64)).values
    if wire_dtype is not None and tensor.dtype.is_floating_point and not name.endswith(FP32_BUFFER_SUFFIXES):
        return tensor.to(wire_dtype)
    return tensor
