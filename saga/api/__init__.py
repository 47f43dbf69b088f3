"""The Python API: load a definition, start and drive runs, read status and history.

Everything the CLI does goes through :class:`Saga`, so a program can do it too::

    from saga import Saga

    with Saga() as s:
        run = s.run("compositions/deploy.yaml", inputs={"service": "api"})
        print(run.status, run.outputs)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga import composition, expressions, secrets
from saga.api.commands import RunCommands, _refuse_redacted
from saga.api.notifications import NotificationCommands
from saga.api.resources import ResourceCommands
from saga.chain import json_safe
from saga.composition import Plan, plan_of, tree_tools
from saga.composition.definition import parse_duration, resolve_inputs
from saga.config import Settings, load_settings
from saga.domain import (
    Run,
    check_labels,
    check_run_id,
    names_a_run,
    queue_options,
)
from saga.errors import (
    ConcurrentWriteError,
    ExpressionError,
    InputError,
    LeaseHeldError,
    Problem,
    RunIdConflictError,
    RunNotFoundError,
    RunStateError,
    SagaError,
)
from saga.executor import TOOL_THREADS, EventHook, Executor, ToolThreads, check_tools
from saga.lazy import lazy
from saga.projection import Projection, open_projection
from saga.scheduler import controls
from saga.scheduler.policy import QUARANTINE_AFTER
from saga.store import (
    Database,
    Leases,
    SagaApplication,
    ToolCache,
    UndoStore,
    default_worker_id,
    open_store,
    wait_for_lease,
)
from saga.store.heartbeats import Heartbeats, show_heartbeats
from saga.telemetry import metrics, tracing
from saga.tools import Registry, load_registry, modules_of
from saga.views import check_moments, row_summary, run_summary, waits_of

if TYPE_CHECKING:
    from saga import audit, replay
    from saga import schedules as schedules_
    from saga import worker as worker_
    from saga.worker import resources as worker_resources
else:  # loaded when first used: a run started here needs none of them (saga.lazy)
    audit, replay = lazy("saga.audit"), lazy("saga.replay")
    schedules_, worker_ = lazy("saga.schedules"), lazy("saga.worker")
    worker_resources = lazy("saga.worker.resources")

log = logging.getLogger("saga")


class Saga(RunCommands, NotificationCommands, ResourceCommands):
    """A handle on one store and one set of tools."""

    _heartbeats: Heartbeats | None = None  # (see heartbeats: opened on first use)

    def __init__(self, settings: Settings | None = None, *, tools: Iterable[str] = (),
                 registry: Registry | None = None, worker: str | None = None) -> None:
        self.settings = settings or load_settings()
        expressions.configure(**self.settings.expression_limits())
        self._tool_modules = tuple(self.settings.tools) + tuple(tools)
        self._registry = registry
        self._app: SagaApplication | None = None
        self._db: Database | None = None
        self._leases: Leases | None = None
        self._projection: Projection | None = None
        self._cache: ToolCache | None = None
        self._undo_store: UndoStore | None = None
        self._schedules: schedules_.Schedules | None = None
        self.worker = worker or default_worker_id()
        self.threads = ToolThreads(4 * TOOL_THREADS)  #: tools' threads (a worker has its own)

    def __enter__(self) -> Saga:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def registry(self) -> Registry:
        """The available tools (loaded on first use)."""
        if self._registry is None:
            self._registry = load_registry(self._tool_modules, settings=self.settings)
        return self._registry

    @property
    def app(self) -> SagaApplication:
        """The event store (opened on first use)."""
        if self._app is None:
            self._app = open_store(self.settings)
        return self._app

    @property
    def leases(self) -> Leases:
        """The run leases of this store (the table is created on first use)."""
        if self._leases is None:
            self.app  # noqa: B018 - the store (and its schema) exists before its side tables
            self._db = Database(self.settings, adopt=self.app.take_connection())
            self._leases = Leases(self._db)
        return self._leases

    def close(self) -> None:
        """Release the store."""
        if self._projection is not None:
            self._projection.close()
            self._projection = None
        if self._db is not None:
            self._db.close()
            self._db, self._leases, self._cache, self._schedules = None, None, None, None
            self._undo_store = None
        if self._app is not None:
            self._app.close()
            self._app = None
        self.threads.close()

    def executor(self, on_events: EventHook | None = None, worker: str | None = None,
                 hold: float | None = None, threads: ToolThreads | None = None) -> Executor:
        """An executor over this store and registry (recording ``worker`` on its starts;
        waiting out in-process only waits up to ``hold`` seconds, default
        ``settings.hold_seconds``; its tools run in ``threads``, default :attr:`threads`)."""
        executor = Executor(self.app, self.registry, worker=worker or self.worker,
                            on_events=on_events, cache=self.cache, undo=self.undo_store,
                            threads=threads or self.threads,
                            hold=self.settings.hold_seconds if hold is None else hold,
                            watch_every=self.settings.watch_seconds)
        executor.resources = self.resources if self.settings.resources else None
        return executor

    @property
    def schedules(self) -> schedules_.Schedules:
        """The schedules of this store (``saga_schedules``)."""
        if self._schedules is None:
            self.leases  # noqa: B018 - opens the side connection the schedules share
            assert self._db is not None
            self._schedules = schedules_.Schedules(self._db)
        return self._schedules

    def fire_schedules(self) -> list[str]:
        """Start the runs of every due schedule time (what workers do each time they look
        for work); the run ids started (or found already started)."""
        def start(definition: dict[str, Any], inputs: dict[str, Any], run_id: str,
                  scheduled_at: str) -> Run:
            plan = composition.compile_any(definition, tools=self.registry.tools())
            return self.submit(plan, inputs, run_id=run_id, actor="schedule:" +
                               run_id.split("@", 1)[0], context={"scheduled_at": scheduled_at})
        return self.schedules.fire_due(start)

    def sync_schedules(self) -> None:
        """Add or change the schedules saga.toml declares (``[schedules.NAME]``)."""
        self.schedules.sync(schedules_.from_config(self.settings.file),
                            lambda source: self.load(source).record())

    @property
    def cache(self) -> ToolCache:
        """The tool-result cache of this store (``cache: seconds`` on steps)."""
        if self._cache is None:
            self.leases  # noqa: B018 - opens the side connection the cache shares
            assert self._db is not None
            self._cache = ToolCache(self._db)
        return self._cache

    @property
    def undo_store(self) -> UndoStore:
        """Where tools' undo state is kept, out of the log (``saga_undo``)."""
        if self._undo_store is None:
            self.leases  # noqa: B018 - opens the side connection the undo store shares
            assert self._db is not None
            self._undo_store = UndoStore(self._db, self.settings.undo_key)
        return self._undo_store

    @property
    def heartbeats(self) -> Heartbeats:
        """Tools' last heartbeats of the attempts in flight (``saga_heartbeats``)."""
        self.leases  # noqa: B018 - opens the side connection the table shares
        assert self._db is not None
        found = self._heartbeats
        if found is None or found.db is not self._db:
            found = self._heartbeats = Heartbeats(self._db)
        return found

    def load(self, source: str | Path | Mapping[str, Any]) -> Plan:
        """Load and validate a composition (a file path or raw data) into a plan, with the
        compositions its ``use`` steps name."""
        return composition.load(source, self.registry.tools())

    def start(self, plan: Plan | str | Path, inputs: Mapping[str, Any] | None = None, *,
              actor: str | None = None, labels: Mapping[str, str] | None = None,
              options: Mapping[str, Any] | None = None, run_id: str | None = None,
              context: Mapping[str, Any] | None = None, queue: str | None = None,
              priority: int | None = None) -> Run:
        """Check inputs and create a run (not yet saved); see :meth:`run` and :meth:`submit`.
        ``context`` adds to the run's recorded context (``scheduled_at``...), as does its
        trace (``trace_id``; ``traceparent`` if ``context`` gives one: its parent span).

        ``queue`` (else the composition's, else ``default``) and ``priority`` (higher is
        claimed first; 0) are recorded in its options: workers claim it by them.

        ``run_id``: the caller's name for the run (``ORDER-42``). Starting a name that
        exists with the same definition and inputs returns that run, already saved (its
        ``pending_events`` is empty: nothing new starts); with anything else it raises
        :class:`RunIdConflictError` and records nothing.
        """
        if not isinstance(plan, Plan):
            plan = self.load(plan)
        resolved = json_safe(resolve_inputs(plan.definition, dict(inputs or {})))
        options = dict(options or {})
        timeout = options.get("timeout", plan.definition.timeout)
        if timeout is not None:
            seconds = parse_duration(timeout)
            if not seconds:
                raise InputError([Problem("timeout", f"{timeout!r} is not a duration")])
            options["timeout"] = seconds
        if self.settings.quarantine_after != QUARANTINE_AFTER:  # recorded: replay agrees
            options.setdefault("quarantine_after", self.settings.quarantine_after)
        options.update(queue_options(queue or options.get("queue") or plan.definition.queue,
                                     options.get("priority") if priority is None else priority))
        if modules := modules_of(tree_tools(plan), self.registry):  # to name in hints
            options.setdefault("tool_modules", modules)
        given = dict(context or {})
        trace = tracing.trace_context(given.pop("traceparent", None))
        recorded_context: dict[str, Any] = {**given, **trace,
                                            "actor": actor or self.settings.actor,
                                            "labels": check_labels(labels or {}),
                                            "mode": (options or {}).get("mode", "normal")}
        hidden = {spec.name: str(resolved[spec.name]) for spec in plan.definition.inputs
                  if spec.secret and resolved.get(spec.name) is not None}
        recorded = {k: secrets.marker(k) if k in hidden else v for k, v in resolved.items()}
        if run_id is not None:
            recorded_context["run_id"] = check_run_id(run_id)
            existing = self._existing(run_id, plan, recorded)
            if existing is not None:
                return existing
        run = self.app.start(plan, recorded, recorded_context, options, run_id=run_id)
        secrets.remember(run.run_id, hidden)
        return run

    def _existing(self, run_id: str, plan: Plan, inputs: dict[str, Any]) -> Run | None:
        """The run already started under ``run_id``, if it was started with this plan and
        these inputs; None if there is none; a conflict otherwise."""
        try:
            run = self.get(run_id)
        except RunNotFoundError:
            return None
        if run.definition_hash != plan.digest():
            raise RunIdConflictError(run_id, f"another definition ({run.name} "
                                             f"{run.definition_hash[:12]})")
        if run.inputs != inputs:
            raise RunIdConflictError(run_id, "other inputs")
        return run

    def _save_new(self, run: Run, plan: Plan | str | Path, inputs: Mapping[str, Any] | None,
                  kwargs: dict[str, Any]) -> Run:
        """Save a run just started; when another process saved the same chosen id first,
        the run it saved (or a conflict)."""
        pending = list(run.pending_events)
        try:
            self.app.save_run(run)
        except ConcurrentWriteError:
            if kwargs.get("run_id") is None:
                raise
            again = self.start(plan, inputs, **kwargs)
            if again.pending_events:
                raise
            return again
        metrics.recorded(run.name, pending)
        return run

    def dry_run(self, plan: Plan | str | Path,
                inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What a run would do, without recording or calling anything: inputs checked, the
        levels, and each step with the parameters known before any step has run."""
        if not isinstance(plan, Plan):
            plan = self.load(plan)
        resolved = resolve_inputs(plan.definition, dict(inputs or {}))
        # A preview is printed: secret inputs show as their markers, never their values.
        hidden = {spec.name for spec in plan.definition.inputs if spec.secret}
        resolved = {k: secrets.marker(k) if k in hidden else v
                    for k, v in resolved.items()}
        names = {"inputs": resolved, "input": resolved, "context": {"actor": self.settings.actor},
                 "steps": {}}
        steps = []
        for step_id in plan.order:
            step = plan.step(step_id)
            try:
                parameters = expressions.render(step.parameters, names)
            except ExpressionError:
                parameters = step.parameters  # depends on outputs not known before the run
            steps.append({"id": step_id, "tool": step.tool, "use": step.use,
                          "compute": step.compute is not None, "loop": step.loop,
                          "depends_on": plan.dependencies(step_id), "when": step.condition,
                          "parameters": parameters, "layer": step.layer,
                          "compensate": step.compensation is not None,
                          "approval": bool(step.confirm)})
        return {"definition": plan.definition.name, "name": plan.definition.name,
                "inputs": resolved, "levels": plan.levels(),
                "critical_path": plan.critical_path(), "steps": steps}

    def submit(self, plan: Plan | str | Path, inputs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> Run:
        """Record a new run without executing it."""
        run = self.start(plan, inputs, **kwargs)
        if not run.pending_events:
            return run  # started before under the same id: nothing new
        return self._save_new(run, plan, inputs, kwargs)

    def run(self, plan: Plan | str | Path, inputs: Mapping[str, Any] | None = None, *,
            on_events: EventHook | None = None, **kwargs: Any) -> Run:
        """Start a run and drive it in this process until it finishes or waits (a run
        started before under the same ``run_id`` is returned as it is: nothing runs again)."""
        run = self.start(plan, inputs, **kwargs)
        if not run.pending_events:
            return run
        return self.drive(run, on_events=on_events)

    def drive(self, run: Run, *, on_events: EventHook | None = None,
              wait: float | None = None) -> Run:
        """Drive a run (new or loaded) here until it finishes or waits, holding its lease
        (waiting up to ``wait`` seconds, default one lease length, for another holder)."""
        try:
            return self._drive(run, on_events, wait)
        except LeaseHeldError as e:  # named as its caller knows it, not by its lease's key
            if e.run_id == run.run_id:
                raise
            raise LeaseHeldError(run.run_id, e.worker) from None

    def _drive(self, run: Run, on_events: EventHook | None, wait: float | None) -> Run:
        seconds = self.settings.lease_seconds
        # Keyed by the run's UUID, as workers claim it (they follow the log by it): keyed
        # by the name its caller chose, a worker and this process could both drive it.
        lease = wait_for_lease(self.leases, str(run.id), self.worker, seconds,
                               seconds if wait is None else wait, run.queue,
                               with_first_append=run.version == len(run.pending_events),
                               appends=self.app.claims_with_append())
        executor = self.executor(on_events)
        try:
            if run.version > 0 and run.pending_events == []:
                run = self.get(run.run_id)  # what the last holder left, now that we hold it
            return executor.drive(run, lease)
        finally:
            executor.close()
            lease.release(quiet=True)

    def resume(self, run_id: str, *, on_events: EventHook | None = None) -> Run:
        """Continue a recorded run that is not finished: after an approval, or after the
        process driving it died (its interrupted attempts are handled per step)."""
        run = self.get(run_id)
        if run.is_finished:
            raise RunStateError(f"run {run_id} already ended {run.status}")
        parent = self._driving_parent(run)
        if parent is not None:  # a child run moves with its parent, whose step drives it
            self.resume(parent, on_events=on_events)
            return self.get(run.run_id)
        _refuse_redacted(run)
        # Before waiting for its lease: a run it could not drive is left as it was.
        check_tools(self.registry, run, get_run=self.app.get_run)
        return self.drive(run, on_events=on_events)

    def _driving_parent(self, run: Run) -> str | None:
        """The unfinished parent run whose ``use:`` step drives this child run, if any."""
        parent = (run.context.get("parent") or {}).get("run_id")
        try:
            return parent if parent and not self.get(parent).is_finished else None
        except RunNotFoundError:
            return None

    def select(self, *, statuses: tuple[str, ...], definition: str | None = None,
               failed_step: str | None = None, since: str | None = None,
               labels: Mapping[str, str] | None = None) -> list[str]:
        """The ids of the runs a bulk command acts on (from the read model, caught up)."""
        rows = [r for status in statuses for r in self.list_runs(
            status, None, since, definition=definition, labels=labels)]
        return [r["run_id"] for r in rows
                if failed_step is None or r["failed_step"] == failed_step]

    def events(self, run_id: str) -> list[Any]:
        """The run's domain events, in order."""
        return self.app.domain_events(self.resolve(run_id))

    def verify(self, run_id: str) -> replay.Divergence | None:
        """Replay the run's history through the current scheduler; the first divergence."""
        events = self.events(run_id)
        if events and audit.redacted(getattr(events[0], "inputs", None)):
            raise RunStateError(f"run {run_id} was redacted by retention: its inputs and "
                                "outputs are gone, so its decisions cannot be replayed")
        return replay.verify(events)

    def state_at(self, run_id: str, at: str) -> Run:
        """The run as it was at a version number or an ISO timestamp."""
        return replay.state_at_point(self.events(run_id), at, run_id)

    def executor_plan(self, run: Run) -> Plan:
        """The plan a run is driven by (its recorded definition, compiled)."""
        return plan_of(run)

    def worker_loop(self, **kwargs: Any) -> worker_.Worker:
        """A worker over this store (see :class:`saga.worker.Worker`)."""
        self.schedules  # noqa: B018 - its table is made before the worker's first look
        found = worker_.Worker(self.app, self.leases, lambda w, threads: self.executor(
            worker=w, hold=worker_.WORKER_HOLD, threads=threads),
            tick=self.fire_schedules, **{"queues": self.settings.queues, **kwargs})
        if self.settings.resources:  # a run waiting for a slot is held off till it may have one
            found.resources = worker_resources.ResourceWaits(self.resources)
        return found

    def get(self, run_id: str, version: int | None = None) -> Run:
        """The run as recorded (``run_id`` may be a unique prefix of its id), loaded once:
        a whole id or name is read as it is, and only one that names no run is looked up
        as a prefix (the run found by its prefix is then read)."""
        if not names_a_run(run_id):
            raise RunNotFoundError(run_id)
        try:
            return self.app.get_run(run_id, version)
        except RunNotFoundError:
            if len(run_id) < 4:
                raise
        return self.app.get_run(self._by_prefix(run_id), version)

    def resolve(self, run_id: str) -> str:
        """A run's id from its id, its name, or a unique prefix of either (at least 4
        characters, as git takes short hashes); RunNotFoundError when none or several
        runs match."""
        if not names_a_run(run_id):
            raise RunNotFoundError(run_id)
        try:
            self.app.get_run(run_id)
            return run_id
        except RunNotFoundError:
            if len(run_id) < 4:
                raise
        return self._by_prefix(run_id)

    def _by_prefix(self, run_id: str) -> str:
        """The one run whose id or name starts with ``run_id``, from the read model."""
        try:
            self.projection.catch_up()
        except Exception as e:  # a prefix is a convenience: a busy read model only limits it
            log.warning("the read model could not catch up: %s", e)
        matches = self.projection.ids_starting(run_id)
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise RunNotFoundError(f"{run_id} (ambiguous: {', '.join(matches[:3])}...)")
        raise RunNotFoundError(run_id)

    def status(self, run_id: str) -> dict[str, Any]:
        """The run's state as a JSON object, with its child runs (nested compositions)."""
        run = self.get(run_id)
        summary = run_summary(run)
        # what the endpoints would accept now, by their own rules: a viewer offers only these
        summary["actions"] = controls.allowed(run)
        show_heartbeats(summary, run.steps, lambda: self.heartbeats)  # long calls' last beats
        children = []
        plan = self.executor_plan(run)
        for key, state in run.steps.items():
            step = plan.step(state["step_id"])
            if step.use is None or (state["iteration"] == 0 and step.iterates):
                continue  # only nested steps have children (a loop's own entry has none)
            child = (state.get("parameters") or {}).get("run")  # recorded when it started
            if not child:
                continue
            try:
                children.append({"step": key, **self.status(child)})
            except RunNotFoundError:
                continue  # its worker died before the child was recorded
        if children:
            summary["children"] = children
        waiting = [{"step": w["step"], "run_id": w["child"],
                    "waiting_for": waits_of(self.get(w["child"]))}
                   for w in waits_of(run) if "child" in w]
        if waiting:  # its step waits for a child run, which waits for these
            summary["waiting_for_children"] = waiting
        return summary

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in order."""
        return self.app.history(self.resolve(run_id))

    @property
    def projection(self) -> Projection:
        """The read model (``saga_runs``, ``saga_steps``) of this store."""
        if self._projection is None:
            self._projection = open_projection(self.app)
        return self._projection

    def list_runs(self, status: str | None = None, limit: int | None = None,
                  since: str | None = None, *, definition: str | None = None,
                  actor: str | None = None, labels: Mapping[str, str] | None = None,
                  until: str | None = None, prefix: str | None = None,
                  offset: int = 0) -> list[dict[str, Any]]:
        """Runs from the read model, newest first, after catching it up (see :meth:`lag`);
        filtered by status, definition name, actor, labels (all must match), start time
        and an id prefix, from the ``offset``-th on."""
        check_moments(since=since, until=until)  # bad bounds are bad input (found by fuzzing)
        try:
            self.projection.catch_up()
        except SagaError:
            raise
        except Exception as e:  # a busy or broken read model must not hide the runs it has
            log.warning("the read model could not catch up: %s", e)
        wanted = dict(labels or {})
        rows = self.projection.runs(status=status, limit=limit or None, since=since,
                                    definition=definition, actor=actor, labels=wanted,
                                    until=until, prefix=prefix, offset=offset)
        runs = [row_summary(row) for row in rows]
        return [r for r in runs if all(r["labels"].get(k) == v for k, v in wanted.items())]

    def lag(self) -> int:
        """How many events the read model has not applied yet."""
        return self.projection.lag()
