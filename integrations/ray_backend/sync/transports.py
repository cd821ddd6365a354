"""The weight transport a sync config names: the Ray object store (`protocol`) or a broadcast group (`broadcast`).

Apart from both so that neither transport's module imports the other: the broadcast transport builds on the
protocol's pieces, and the controller picks one here.
"""

from __future__ import annotations

from ..settings import SyncConfig
from .protocol import ObjectStoreTransport, WeightTransport


def make_transport(config: SyncConfig) -> WeightTransport:
    """The transport named by `config.transport`."""
    if config.transport == "object_store":
        return ObjectStoreTransport()
    from .broadcast import TorchBroadcastTransport

    return TorchBroadcastTransport(backend=config.backend)
