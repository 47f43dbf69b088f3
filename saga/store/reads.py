"""Loading a run: its latest snapshot, then only the events after that snapshot's version.

Both stores read by the events table's primary key (run id, version), from the
snapshot's version on, so loading a long run from a snapshot at its last version reads
what a short run's load reads (issue 44). The run is folded here, as
:meth:`SagaApplication._build <saga.store.application.SagaApplication._build>` folds it,
not by the library's repository: its projector checks every event against a runtime
``Protocol`` (``isinstance`` walks the protocol's members), which was half the time of
a long replay on SQLite and made it twice PostgreSQL's, whose recorder already read
runs this way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from saga.domain import Run
    from saga.store.application import SagaApplication


def load_run(app: SagaApplication, uid: UUID) -> Run | None:
    """The run stored under ``uid`` (None: no event and no snapshot of it): in one round
    trip with saga's PostgreSQL recorder (its latest snapshot and the events after it),
    else in two (the library's recorders: the snapshot, then the events after it; events
    are only appended, so none can be missed between the two)."""
    recorder: Any = app.recorder
    if hasattr(recorder, "select_run"):
        return app._build(*recorder.select_run(uid, app._snapshot_table()))
    snapshots: Any = app.snapshots
    last = snapshots.recorder.select_events(uid, desc=True, limit=1) \
        if snapshots is not None else []
    after = last[0].originator_version if last else None
    return app._build(last[0] if last else None, recorder.select_events(uid, gt=after))
