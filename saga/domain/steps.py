"""The step executions of a run (:class:`~saga.domain.run.Run` ``.steps``) and the
indexes derived from them.

The indexes are kept by the events as they are applied (``Run.Event.mutate`` calls
:meth:`StepStates._reindex`; a new key is indexed where it is created), so they hold for
whatever state the object has. A snapshot never stores them: absent, they are rebuilt from
``steps`` on first use. They let a decision look at the steps still open instead of at
every step of a long run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from saga.domain.vocabulary import StepState, step_key

#: A step execution in one of these states is settled: nothing is left to decide for it.
SETTLED = frozenset({"completed", "skipped", "compensated"})
#: The attributes holding what is derived (indexes, the run's id as text), which a
#: snapshot leaves out.
DERIVED = ("_unsettled", "_touched", "_derived", "_run_id")


class StepStates:
    """Reading and creating a run's step executions, and their derived indexes."""

    steps: dict[str, StepState]
    suspect: bool  # see Run.suspect

    def step(self, key: str) -> StepState:
        """The state of one step execution (status ``pending`` if nothing happened yet)."""
        return self.steps.get(key) or {"status": "pending", "attempt": 0}

    def _step(self, step_id: str, iteration: int) -> StepState:
        key = step_key(step_id, iteration)
        if key not in self.steps:
            state: StepState = {
                "step_id": step_id, "iteration": iteration, "status": "pending", "attempt": 0,
                "output": None, "error": None, "retry_at": None, "started_at": None,
                "finished_at": None, "duration_ms": None}
            self.steps[key] = state
            # A new key goes last in steps, so last in the indexes kept in steps order.
            unsettled = self.__dict__.get("_unsettled")
            if unsettled is not None:
                unsettled[key] = state
            touched = self.__dict__.get("_touched")
            if touched is not None and iteration == 0:
                touched.append(step_id)
        return self.steps[key]

    @property
    def unsettled(self) -> dict[str, StepState]:
        """The step executions not completed, skipped or compensated (running, failed,
        or pending again after a retry), by key, in the order of ``steps``."""
        index: dict[str, StepState] | None = self.__dict__.get("_unsettled")
        if index is None:
            index = self.__dict__["_unsettled"] = {
                k: s for k, s in self.steps.items() if s["status"] not in SETTLED}
        return index

    @property
    def touched(self) -> list[str]:
        """The ids of the steps whose own execution (iteration 0) is recorded, in the
        order they were first recorded: it only grows over the run's life."""
        log: list[str] | None = self.__dict__.get("_touched")
        if log is None:
            log = self.__dict__["_touched"] = [
                s["step_id"] for s in self.steps.values() if s["iteration"] == 0]
        return log

    def derived(self) -> dict[str, Any]:
        """Room for what a reader folds of this object's :attr:`touched` log (the
        scheduler's frontier): it goes with the object and is never stored."""
        room: dict[str, Any] = self.__dict__.setdefault("_derived", {})
        return room

    def _reindex(self, keys: list[str]) -> None:
        """Bring :attr:`unsettled` up to date after an event changed these keys."""
        index: dict[str, StepState] | None = self.__dict__.get("_unsettled")
        if index is None:
            return
        for key in keys:
            state = self.steps.get(key)
            if state is None:
                continue
            if state["status"] in SETTLED:
                index.pop(key, None)
            elif key not in index:  # open again (a retry): rare, so rebuilt in steps order
                del self.__dict__["_unsettled"]
                return

    def _interrupt(self, seen: dict[str, Any]) -> None:
        """A worker took the run over (``seen``: see ``Run.RunTakenOver``): each attempt in
        flight counts one interruption of its step execution, and counts against it
        (``blamed``) only when the attempt likely caused the death: the run was a suspect
        already (taken over before, with no step completed since, so its worker drove it
        alone), and the worker that started the attempt never renewed its lease after
        (it died at once). A worker killed for another reason (another run's, an
        operator's) most likely lived on past a renewal, or drove other runs beside it."""
        renewed = seen.get("renewed_at")
        for state in self.unsettled.values():
            if state["status"] != "running" or state.get("wait"):
                continue
            state["interrupted"] = state.get("interrupted", 0) + 1
            started = state.get("attempt_started_at")
            if self.suspect and renewed is not None and started is not None \
                    and seen.get("worker") == state.get("worker") \
                    and datetime.fromisoformat(renewed) <= datetime.fromisoformat(started):
                state["blamed"] = state.get("blamed", 0) + 1
        # An undo call in flight (started, never ended: see saga.domain.undos) was cut
        # short too: it runs again, knowingly, under the same key.
        comp: dict[str, Any] | None = getattr(self, "compensation", None)
        if comp:
            cut = comp.setdefault("interrupted", {})
            for key in comp.get("calls") or {}:
                if key not in comp["done"]:
                    cut[key] = cut.get(key, 0) + 1
        self.suspect = True

    @property
    def waits(self) -> dict[str, dict[str, Any]]:
        """Steps waiting for a time or a signal, by key."""
        return {k: wait for k, s in self.unsettled.items()
                if s["status"] == "running" and (wait := s.get("wait"))}
