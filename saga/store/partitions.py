"""Runs spread over several PostgreSQL databases (or servers) by run id.

A run is one aggregate: every event of it lives in one partition, chosen by a stable hash
of its id (:func:`partition_of`: SHA-256 of the run's store key, the same in every
process and on every host), so no transaction ever spans two partitions.
:class:`PartitionedApp` stands where one :class:`SagaApplication` stands and sends each
run-level call to the run's partition. What reads across runs reads every partition:
each keeps its own notification log, and so its own read-model rows and positions
(:mod:`saga.projection` merges them; a worker follows every log, :mod:`saga.worker`).

The side tables that are not a run's events (leases and queue limits, schedules, the
tool cache, the undo store) stay in the first partition, the home one: leases and queue
limits hold across every worker together, as with one database.

Each partition records its place (``saga_partition``: its index and the count); opening
it in another place or alone, or a partitioned store over a database that already holds
runs recorded without partitions, is refused (:func:`saga.store.side_tables.check_place`):
its runs would no longer be found by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from uuid import UUID

from saga.config import Settings
from saga.domain import Run, run_uuid
from saga.errors import ConfigError
from saga.store.application import SagaApplication, event_json
from saga.store.leases import LeaseClaim, LeaseRelease


def partition_of(run_id: str | UUID, count: int) -> int:
    """The partition (0 .. count-1) of a run: from its store key, so a run's id and the
    name its caller chose (``ORDER-42``) land in the same one."""
    digest = hashlib.sha256(run_uuid(run_id).bytes).digest()
    return int.from_bytes(digest[:8], "big") % count


def partition_settings(settings: Settings) -> list[Settings]:
    """One unpartitioned Settings per partition (just ``[settings]`` without partitions)."""
    if not settings.partitions:
        return [settings]
    return [replace(settings, database_url=url, partitions=()) for url in settings.partitions]


def parts_of(app: SagaApplication) -> list[SagaApplication]:
    """The applications of every partition of ``app`` (``[app]`` when unpartitioned)."""
    return list(app.parts) if isinstance(app, PartitionedApp) else [app]


def part_for(app: SagaApplication, run_id: str | UUID) -> SagaApplication:
    """The application holding ``run_id`` (``app`` itself when unpartitioned)."""
    return app.part(run_id) if isinstance(app, PartitionedApp) else app


class PartitionedApp(SagaApplication):
    """The store of runs over several partitions: each run-level call goes to the run's
    partition (one ``SagaApplication`` each). The notification log has no single order
    here: reading it (``notifications``, ``head``) is refused, the callers that follow
    it take :func:`parts_of` instead."""

    def __init__(self, settings: Settings) -> None:
        # Not the library's __init__: this application has no recorder of its own.
        self.settings = settings
        self.parts: list[SagaApplication] = []
        self._threads: ThreadPoolExecutor | None = None
        try:
            for index, part in enumerate(partition_settings(settings)):
                self.parts.append(SagaApplication(part, (index, len(settings.partitions))))
        except BaseException:
            self.close()
            raise
        self.reconnect = self.parts[0].reconnect

    def __getattr__(self, name: str) -> Any:
        # What the library's Application keeps (recorder, repository, ...) exists only
        # per partition: a caller that reaches for it has not been made partition-aware.
        if name.startswith("__"):
            raise AttributeError(name)  # protocols (copy, pickle) probing: not ours to refuse
        raise ConfigError(f"{name!r} is not available on a partitioned store "
                          f"({len(self.settings.partitions)} partitions): this command "
                          "reads one database")

    def part(self, run_id: str | UUID) -> SagaApplication:
        """The partition's application that holds ``run_id``."""
        return self.parts[partition_of(run_id, len(self.parts))]

    @property
    def mapper(self) -> Any:  # type: ignore[override]
        """The event mapper (the same in every partition)."""
        return self.parts[0].mapper

    def start(self, plan: Any, inputs: dict[str, Any], context: dict[str, Any],
              options: dict[str, Any] | None = None, run_id: str | None = None) -> Run:
        """A new run (not yet saved): it is saved in the partition its id names."""
        return self.parts[0].start(plan, inputs, context, options, run_id)

    def get_run(self, run_id: str | UUID, version: int | None = None) -> Run:
        """The run as recorded, from its partition."""
        return self.part(run_id).get_run(run_id, version)

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The runs as recorded, by id, one read in each partition they are in."""
        runs: dict[str, Run] = {}
        for index, members in self._by_part(run_ids).items():
            runs.update(self.parts[index].get_runs([run_ids[i] for i in members]))
        return runs

    def _by_part(self, run_ids: Sequence[str | UUID]) -> dict[int, list[int]]:
        """The positions in ``run_ids`` of the runs each partition holds."""
        by_part: dict[int, list[int]] = {}
        for i, run_id in enumerate(run_ids):
            by_part.setdefault(partition_of(run_id, len(self.parts)), []).append(i)
        return by_part

    def rebuild(self, run_id: str | UUID, version: int | None = None) -> Run:
        """The run folded from its events alone, from its partition."""
        return self.part(run_id).rebuild(run_id, version)

    def claims_with_append(self) -> bool:
        """False: leases live in the first partition, a run's events in its own."""
        return False

    def save_run(self, run: Run, claim: LeaseClaim | None = None,
                 release: LeaseRelease | None = None) -> None:
        """Append the run's pending events in its partition (one transaction there)."""
        if claim is not None or release is not None:
            raise ConfigError("a partitioned store claims and releases leases on their own")
        self.part(run.id).save_run(run)

    def save_runs(self, runs: list[Run], release: LeaseRelease | None = None
                  ) -> list[Exception | None]:
        """Group commit per partition: one transaction in each partition touched."""
        if release is not None:
            raise ConfigError("a partitioned store claims and releases leases on their own")
        results: list[Exception | None] = [None] * len(runs)
        by_part = self._by_part([run.id for run in runs])
        if len(by_part) == 1:
            index = next(iter(by_part))
            return self.parts[index].save_runs(runs)
        # The partitions' commits overlap: a batch waits for the slowest, not for the sum.
        saves = {index: self._pool().submit(self.parts[index].save_runs,
                                            [runs[i] for i in members])
                 for index, members in by_part.items()}
        for index, members in by_part.items():
            for i, error in zip(members, saves[index].result(), strict=True):
                results[i] = error
        return results

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(len(self.parts), "saga-partition")
        return self._threads

    def domain_events(self, run_id: str | UUID) -> list[Any]:
        """Every event of a run, in order, from its partition."""
        return self.part(run_id).domain_events(run_id)

    def events_of(self, run_id: str | UUID, *, gt: int | None = None, lte: int | None = None,
                  desc: bool = False, limit: int | None = None) -> list[Any]:
        """A run's events, from its partition."""
        return self.part(run_id).events_of(run_id, gt=gt, lte=lte, desc=desc, limit=limit)

    def history(self, run_id: str | UUID) -> list[dict[str, Any]]:
        """Every event of a run as plain JSON objects."""
        return [event_json(e) for e in self.domain_events(run_id)]

    def run_ids(self, start: int = 1) -> Iterator[tuple[int, str]]:
        """(position, run id) of every run, partition after partition (``start`` and the
        positions are each partition's own)."""
        for part in self.parts:
            yield from part.run_ids(start)

    def notifications(self, start: int, limit: int, *, stop: int | None = None,
                      topics: Sequence[str] = ()) -> list[Any]:
        """Refused: each partition has its own log (see :func:`parts_of`)."""
        raise ConfigError("a partitioned store has one event log per partition: the "
                          "live event stream and log positions read one database")

    def head(self) -> int:
        """Refused, as :meth:`notifications`."""
        return len(self.notifications(0, 0))

    def close(self) -> None:
        """Release every partition's connections."""
        threads = self.__dict__.get("_threads")
        if threads is not None:
            threads.shutdown(wait=True)
            self._threads = None
        for part in self.__dict__.get("parts", []):
            part.close()


def open_store(settings: Settings) -> SagaApplication:
    """The configured store: one application, or one over every partition."""
    return PartitionedApp(settings) if settings.partitions else SagaApplication(settings)
