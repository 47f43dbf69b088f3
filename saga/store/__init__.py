"""Where runs are kept: the event store and the side tables beside it.

:mod:`~saga.store.application` is the eventsourcing application (the only caller of
``save()``); :mod:`~saga.store.side_tables` is plain SQL on the same database for what is
not an event (:mod:`~saga.store.leases` on runs, the tool-result
:mod:`~saga.store.cache`, the :mod:`~saga.store.undo` store of tools' undo state). SQLite
by default, PostgreSQL with ``SAGA_DATABASE_URL``.
"""

from saga.store.application import SagaApplication, event_json, open_app
from saga.store.cache import ToolCache
from saga.store.leases import Lease, Leases, default_worker_id, wait_for_lease
from saga.store.partitions import PartitionedApp, open_store, partition_of
from saga.store.side_tables import Database
from saga.store.undo import UndoStore

__all__ = ["Database", "Lease", "Leases", "PartitionedApp", "SagaApplication", "ToolCache",
           "UndoStore", "default_worker_id", "event_json", "open_app", "open_store",
           "partition_of", "wait_for_lease"]
