"""Audit integrity: verify each run's hash chain on the raw store, export it, apply retention.

:mod:`~saga.audit.chain` is the pure verifier; :mod:`~saga.audit.store` reads raw records;
:mod:`~saga.audit.export` and :mod:`~saga.audit.retention` are what their names say.
"""

from saga.audit.chain import (
    EVENT_DELETED,
    FORGED,
    INSERTED_OR_REORDERED,
    NOT_A_CHAIN,
    PAYLOAD_EDITED,
    REASONS,
    REDACTABLE,
    REDACTED,
    SNAPSHOT_DOCTORED,
    TRANSPLANTED,
    Record,
    Result,
    redacted,
    verify_records,
)
from saga.audit.export import export_events, export_run, parse_export, verify_export
from saga.audit.retention import apply_retention
from saga.audit.store import audit_key, read_records, run_ids, verify_store
from saga.errors import RunNotFoundError

__all__ = [
    "EVENT_DELETED", "FORGED", "INSERTED_OR_REORDERED", "NOT_A_CHAIN", "PAYLOAD_EDITED",
    "REASONS", "REDACTABLE", "REDACTED", "SNAPSHOT_DOCTORED", "TRANSPLANTED", "Record",
    "Result", "RunNotFoundError",
    "apply_retention", "audit_key", "export_events", "export_run", "parse_export",
    "read_records", "redacted", "run_ids", "verify_export", "verify_records", "verify_store",
]
