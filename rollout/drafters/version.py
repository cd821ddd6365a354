"""DrafterVersion: the one thing that crosses learner → backend → engine when a drafter changes.

    version = DrafterVersion(number=3, weights=head.state_dict(), draft_vocab=ids, acceptance=0.71)
    engine.load_drafter(version)                          # specroll's engine or vLLM's (`integrations.vllm`)
    assert served_digest == version.digest(torch.bfloat16)  # what a worker checks after every load

A published drafter is its weights (parameter name → tensor, nothing else), the draft vocabulary it drafts over
(sorted int64 target ids, None: the whole vocabulary), the held-out acceptance the learner measured for it (Σ min(p,
q), and the mean of the positions' bounds under the invariant sampler) and its version number. Its digest is
BLAKE2b over the weights in sorted-name order (name, shape, dtype, bytes) and then the vocabulary's ids: every
floating tensor hashed in the wire dtype — the engine's, the dtype a weight sync delivers it in — except the buffers
the engine keeps in fp32 (`models.weights.FP32_BUFFER_SUFFIXES`), so an fp32 learner and a bf16 engine holding the
same version agree. The acceptance numbers are measurements, not weights: they are not hashed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..models.weights import FP32_BUFFER_SUFFIXES

DIGEST_BYTES = 16


@dataclass(frozen=True)
class DrafterVersion:
    """A published drafter version (see the module doc). `weights` may be a subset of the drafter's parameters
    (a sync sends what changed); `draft_vocab` None keeps the whole vocabulary."""

    number: int
    weights: Mapping[str, torch.Tensor]
    draft_vocab: torch.Tensor | None = None
    acceptance: float | None = None
    invariant_acceptance: float | None = None
    _digests: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.number, int) or isinstance(self.number, bool) or self.number < 0:
            raise ValueError(f"DrafterVersion.number={self.number!r} is invalid: an int >= 0")
        if not self.weights:
            raise ValueError("DrafterVersion.weights is empty: a version carries the drafter's parameters")
        if self.draft_vocab is not None:
            ids = torch.as_tensor(self.draft_vocab)
            if ids.dim() != 1 or ids.numel() < 1 or ids.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"DrafterVersion.draft_vocab {tuple(ids.shape)} {ids.dtype} is invalid: a 1-D int "
                                 "tensor of target ids, or None (the whole vocabulary)")
            object.__setattr__(self, "draft_vocab", ids.long().unique(sorted=True).cpu())
        for name in ("acceptance", "invariant_acceptance"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"DrafterVersion.{name}={value!r} is invalid: a number in [0, 1] or None")

    @property
    def served_invariant_acceptance(self) -> float | None:
        """The invariant sampler's acceptance bound: measured, else the bound of the mean, a / (2 - a)."""
        if self.invariant_acceptance is not None or self.acceptance is None:
            return self.invariant_acceptance
        return self.acceptance / (2 - self.acceptance)

    def digest(self, wire_dtype: torch.dtype | None = None) -> str:
        """Hex digest of this version as a sync to an engine of `wire_dtype` delivers it (see the module doc)."""
        key = str(wire_dtype)
        if key not in self._digests:
            self._digests[key] = drafter_digest(self.weights, self.draft_vocab, wire_dtype)
        return self._digests[key]

    def with_number(self, number: int) -> DrafterVersion:
        """The same drafter published as version `number`."""
        return DrafterVersion(number, self.weights, self.draft_vocab, self.acceptance, self.invariant_acceptance)


def drafter_digest(weights: Mapping[str, torch.Tensor], draft_vocab: torch.Tensor | None = None,
                   wire_dtype: torch.dtype | None = None) -> str:
    """Hex BLAKE2b digest of a drafter's `weights` and `draft_vocab` (see the module doc). Computed alike by the
    learner (what it publishes) and by every engine (what it serves)."""
    if not weights:
        raise ValueError("weights is empty: a digest of no weights checks nothing")
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for name in sorted(weights):
        tensor = weights[name].detach()
        if wire_dtype is not None and tensor.dtype.is_floating_point and not name.endswith(FP32_BUFFER_SUFFIXES):
            tensor = tensor.to(wire_dtype)
        _update(digest, name, tensor)
    if draft_vocab is not None:
        _update(digest, "<draft_vocab>", torch.sort(torch.as_tensor(draft_vocab).to(torch.int64).cpu()).values)
    return digest.hexdigest()


def _update(digest, name: str, tensor: torch.Tensor) -> None:
    digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
    digest.update(tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
