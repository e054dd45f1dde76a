"""The model pool: several models in one container, loaded on demand and unloaded when idle,
evicted for room or dead (docs/models.md). It knows no API: it hands out leases on engines,
and its errors are app.base.errors' (ModelNotFound, PoolBusy, ModelTooLarge, ModelLoadFailed,
ModelNotReady), which each API words in its own shape."""

from app.core.pool.entry import CatalogLike, PoolEngine, Spec, keep_seconds
from app.core.pool.pool import Lease, ModelPool
from app.core.pool.status import ModelStatus

__all__ = ["CatalogLike", "Lease", "ModelPool", "ModelStatus", "PoolEngine", "Spec",
           "keep_seconds"]
