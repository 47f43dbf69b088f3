"""The template library: ready compositions in the repository's ``templates/`` folder.

A template is an ordinary composition file (``.yaml``, ``.yml`` or ``.json``) whose
``metadata`` says what it is for: ``{title, category, tags, required_tools}``, and
optionally ``example`` (a command line) and ``config`` (the saga.toml it needs). It is
found by its file stem (``money-transfer``). ``SAGA_TEMPLATES`` (directories separated by
``os.pathsep``) or saga.toml ``templates = ["dir", ...]`` add folders of one's own; they
are searched before the built-in folder, so a file of the same stem overrides a built-in.

Statistics come from the read model (:mod:`saga.projection`): the runs whose recorded
``definition_name`` is the template's ``name``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga.config import Settings
from saga.definition import load_file
from saga.errors import ConfigError, DefinitionError

if TYPE_CHECKING:
    from saga.api import Saga

#: The built-in templates: the ``templates/`` folder next to the ``saga`` package.
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
SUFFIXES = (".yaml", ".yml", ".json")
FINISHED = ("completed", "failed", "compensated", "cancelled")


@dataclass(frozen=True)
class TemplateInfo:
    """What ``saga templates list`` shows about one template file."""

    name: str  # the file stem, how the template is found
    path: Path
    definition_name: str = ""  # the composition's own ``name`` (what runs record)
    title: str = ""
    description: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    required_tools: tuple[str, ...] = ()
    version: str = ""
    inputs: tuple[dict[str, Any], ...] = field(default=())
    example: str = ""  # metadata.example: a command line that runs it
    config: str = ""  # metadata.config: the saga.toml it needs (shell allowlist, servers)
    error: str | None = None  # set when the file cannot be read as a composition

    def to_json(self) -> dict[str, Any]:
        """The template as plain JSON."""
        data = asdict(self)
        data.update(path=str(self.path), tags=list(self.tags),
                    required_tools=list(self.required_tools), inputs=list(self.inputs))
        return data


def template_dirs(settings: Settings | None = None,
                  env: Mapping[str, str] | None = None) -> list[Path]:
    """The folders searched, in order: ``SAGA_TEMPLATES``, saga.toml ``templates``, built-in."""
    env = os.environ if env is None else env
    extra: list[str] = [p for p in env.get("SAGA_TEMPLATES", "").split(os.pathsep) if p]
    configured = (settings.file if settings is not None else {}).get("templates")
    if isinstance(configured, str):
        extra.append(configured)
    elif isinstance(configured, list):
        extra += [str(p) for p in configured]
    dirs = [Path(p).expanduser() for p in extra] + [TEMPLATES_DIR]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def _files(dirs: list[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in dirs:
        for path in sorted(folder.iterdir()):
            if path.suffix in SUFFIXES and path.is_file():
                found.setdefault(path.stem, path)  # earlier folders win
    return found


def read_template(path: Path) -> TemplateInfo:
    """The metadata of one template file (``error`` set when it cannot be parsed)."""
    try:
        data = load_file(path)
    except DefinitionError as e:
        return TemplateInfo(path.stem, path, error=str(e))
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    description = " ".join(str(data.get("description") or meta.get("description") or "").split())
    raw_inputs = data.get("inputs") or []
    if isinstance(raw_inputs, dict):
        raw_inputs = [{"name": k, **(v if isinstance(v, dict) else {"type": v})}
                      for k, v in raw_inputs.items()]
    inputs = tuple({k: spec.get(k) for k in ("name", "type", "required", "default",
                                             "description") if k in spec}
                   for spec in raw_inputs if isinstance(spec, dict))
    return TemplateInfo(
        name=path.stem, path=path, definition_name=str(data.get("name", "")),
        title=str(meta.get("title") or path.stem.replace("-", " ").capitalize()),
        description=description, category=str(meta.get("category", "")),
        tags=tuple(str(t) for t in meta.get("tags") or ()),
        required_tools=tuple(str(t) for t in meta.get("required_tools") or ()),
        version=str(data.get("version", "")), inputs=inputs,
        example=" ".join(str(meta.get("example") or "").split()),
        config=str(meta.get("config") or ""))


def list_templates(settings: Settings | None = None) -> list[TemplateInfo]:
    """Every template, sorted by category then name."""
    infos = [read_template(p) for p in _files(template_dirs(settings)).values()]
    return sorted(infos, key=lambda t: (t.category, t.name))


def find_template(name: str, settings: Settings | None = None) -> Path:
    """The file of the template ``name`` (a file stem), or ConfigError naming close matches."""
    files = _files(template_dirs(settings))
    stem = Path(name).stem if Path(name).suffix in SUFFIXES else name
    if stem in files:
        return files[stem]
    close = difflib.get_close_matches(stem, files, n=3, cutoff=0.5)
    close += [n for n in sorted(files) if stem and stem in n and n not in close][:3]
    hint = f"did you mean {', '.join(close)}?" if close else \
        f"known templates: {', '.join(sorted(files)) or 'none'}"
    raise ConfigError(f"unknown template {name!r}; {hint} (see `saga templates list`)")


def _runs(saga: Saga) -> list[dict[str, Any]]:
    """Every row of the read model's ``saga_runs``, after catching up with the log."""
    from saga.projection import Projection

    projection = Projection(saga.app)
    try:
        projection.catch_up()
        return projection.runs(limit=None)
    finally:
        projection.close()


def _stats(info: TemplateInfo, rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if r["definition_name"] == info.definition_name]
    by_status: dict[str, int] = {}
    for row in rows:
        by_status[row["status"]] = by_status.get(row["status"], 0) + 1
    finished = [r for r in rows if r["status"] in FINISHED]
    durations = [int(r["duration_ms"]) for r in finished if r["duration_ms"] is not None]
    return {
        "template": info.name,
        "definition_name": info.definition_name,
        "runs": len(rows),
        "finished": len(finished),
        "by_status": by_status,
        "success_rate": (by_status.get("completed", 0) / len(finished)) if finished else None,
        "mean_duration_ms": (sum(durations) / len(durations)) if durations else None,
        "last_run_at": max((r["started_at"] for r in rows if r["started_at"]), default=None),
    }


def template_stats(saga: Saga, name: str) -> dict[str, Any]:
    """Runs of one template from the read model: ``runs``, ``finished``, ``by_status``,
    ``success_rate`` (completed over finished runs: completed, failed, compensated or
    cancelled; None before any), ``mean_duration_ms`` of finished runs and
    ``last_run_at``. Runs count when their ``definition_name`` is the template's name."""
    return _stats(read_template(find_template(name, saga.settings)), _runs(saga))


def templates_stats(saga: Saga, templates: list[TemplateInfo] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """:func:`template_stats` of many templates (default: every one) by template name,
    reading the read model once."""
    rows = _runs(saga)
    infos = templates if templates is not None else list_templates(saga.settings)
    return {info.name: _stats(info, rows) for info in infos}
