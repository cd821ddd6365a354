"""What a weight sync sends to every receiver besides the bytes: the layout and the version.

Standard library only, so that an actor which only holds payloads (the `WeightBoard`) unpickles them
without importing torch or transformers: its process starts in about a second instead of four to five.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TensorMeta:
    """Where one named tensor lives: bucket index, byte offset and size, original shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class DrafterMeta:
    """What a drafter version (`rollout.drafters.version.DrafterVersion`) carries besides its weights: the draft
    vocabulary (sorted target ids; None: the whole vocabulary) and the held-out acceptance the learner measured."""

    draft_vocab: tuple[int, ...] | None = None
    acceptance: float | None = None
    invariant_acceptance: float | None = None


@dataclass(frozen=True)
class WeightPayload:
    """What every receiver gets: the layout, the version, transport-specific `route` data (the bucket ObjectRefs
    for the object store; the group for a broadcast; a `PeerRoute` on the board), the digest of the version as the
    sender's source computed it (`DrafterVersion.digest`; None: not checked), which a receiver recomputes over
    what arrived and refuses the version on a mismatch, and for a drafter the rest of its version (`drafter`)."""

    version: int
    metas: tuple[TensorMeta, ...]
    bucket_sizes: tuple[int, ...]
    route: Any = None
    digest: str | None = None
    drafter: DrafterMeta | None = None


@dataclass(frozen=True)
class PeerRoute:
    """Where a version sent by broadcast can be found again: a ref to the (worker index, actor handle) of every
    worker that staged it; any of them exports it (`RolloutWorker.export_weights`) to a worker that restarted.
    A ref, not the handles: unpickling an actor handle loads the actor's class — torch with it — and the
    board must stay light."""

    holders: Any  # ray.ObjectRef to tuple[tuple[int, ActorHandle], ...]
