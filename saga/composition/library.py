"""The template library: ready compositions shipped in the package's ``templates/`` folder.

A template is an ordinary composition file (``.yaml``, ``.yml`` or ``.json``) whose
``metadata`` says what it is for: ``{title, category, tags, required_tools}``, and
optionally ``example`` (a command line) and ``config`` (the saga.toml it needs). It is
found by its file stem (``money-transfer``). ``SAGA_TEMPLATES`` (directories separated by
``os.pathsep``) or saga.toml ``templates = ["dir", ...]`` add folders of one's own; they
are searched before the built-in folder, so a file of the same stem overrides a built-in.

How often each template ran, and how well, is :mod:`saga.report`'s business.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga.composition.definition import load_file
from saga.config import Settings
from saga.errors import ConfigError, DefinitionError
from saga.lazy import lazy

if TYPE_CHECKING:
    import difflib
else:
    difflib = lazy("difflib")  # only a name not found needs it

#: The built-in templates: package data, so an installed wheel has them too.
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
SUFFIXES = (".yaml", ".yml", ".json")


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
    meta: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
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
