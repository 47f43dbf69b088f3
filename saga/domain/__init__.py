"""The domain: the ``Run`` aggregate (:mod:`~saga.domain.run`) and the vocabulary every
stage speaks about runs (:mod:`~saga.domain.vocabulary`)."""

from saga.domain.run import Run
from saga.domain.vocabulary import (
    DECISIONS,
    ENDINGS,
    EVENT_TYPES,
    RUN_STATUSES,
    TERMINAL,
    TOPIC_PREFIX,
    RunStatus,
    StepState,
    StepStatus,
    check_labels,
    check_run_id,
    child_run_id,
    event_name,
    idempotency_key,
    iso,
    ms_between,
    run_uuid,
    status_after,
    step_key,
)

__all__ = [
    "DECISIONS",
    "ENDINGS",
    "EVENT_TYPES",
    "RUN_STATUSES",
    "TERMINAL",
    "TOPIC_PREFIX",
    "Run",
    "RunStatus",
    "StepState",
    "StepStatus",
    "check_labels",
    "check_run_id",
    "child_run_id",
    "event_name",
    "idempotency_key",
    "iso",
    "ms_between",
    "run_uuid",
    "status_after",
    "step_key",
]
