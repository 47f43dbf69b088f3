"""Resource limits through :class:`~saga.api.Saga`: the slots saga.toml's
``[resources.NAME]`` limits, as the store holds them for every worker (see
:mod:`saga.store.resources`): what ``saga resources``, ``GET /api/v1/resources`` and
the metrics show."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from saga.config import Settings
from saga.store.resources import ResourceSlots

if TYPE_CHECKING:
    from saga.store import Leases
    from saga.store.side_tables import Database


def _period(seconds: float | None) -> str:
    """A rate's period as saga.toml spells it: ``s``, ``min``, ``h``, ``d`` or ``10s``."""
    named = {1.0: "s", 60.0: "min", 3600.0: "h", 86400.0: "d"}
    return named.get(seconds or 1.0, f"{seconds:g}s")


def _iso(posix: float) -> str:
    return datetime.fromtimestamp(posix, UTC).isoformat()


class ResourceCommands:
    """Resource slots (mixed into :class:`~saga.api.Saga`)."""

    settings: Settings
    _db: Database | None

    if TYPE_CHECKING:
        @property
        def leases(self) -> Leases: ...

    @property
    def resources(self) -> ResourceSlots:
        """The slots of saga.toml's ``[resources.NAME]`` limits, held in the store
        (``saga_resource_slots``; see :mod:`saga.store.resources`)."""
        self.leases  # noqa: B018 - opens the side connection the tables share
        assert self._db is not None
        found: ResourceSlots | None = self.__dict__.get("_resources")
        if found is None or found.db is not self._db:
            found = self.__dict__["_resources"] = ResourceSlots(self._db,
                                                                self.settings.resources)
        return found

    def resource_usage(self) -> dict[str, tuple[int, int, int | None]]:
        """Each resource saga.toml limits, as the store holds it now (every worker's
        calls): ``(slots in use, calls waiting, concurrency)``."""
        return {name: (u.in_use, u.waiting, u.limit.concurrency)
                for name, u in self.resources.usage().items()}

    def resource_report(self, *, calls: bool = True) -> list[dict[str, Any]]:
        """Each limited resource: its limits, the calls holding a slot and those waiting
        (in line, first served first); ``calls=False``: their counts only."""
        slots = self.resources
        out = []
        for name, usage in sorted(slots.usage().items()):
            limit = usage.limit
            entry: dict[str, Any] = {
                "resource": name, "concurrency": limit.concurrency,
                "rate": None if limit.rate is None else f"{limit.rate}/{_period(limit.per)}",
                "burst": limit.burst, "in_use": usage.in_use, "waiting": usage.waiting}
            if calls:
                entry["holders"] = [
                    {"run_id": h["run_id"], "step": h["step"], "worker": h["worker"],
                     "since": _iso(h["acquired_at"]), "expires": _iso(h["expires_at"])}
                    for h in slots.holders(name)]
                entry["waiters"] = [{"run_id": w["run_id"], "step": w["step"],
                                     "since": _iso(w["since"])} for w in slots.waiters(name)]
            out.append(entry)
        return out
