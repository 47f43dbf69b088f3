"""The template library: ready compositions shipped in the package's ``templates/`` folder.

A template is an ordinary composition file (``.yaml``, ``.yml`` or ``.json``) whose
``metadata`` says what it is for: ``{title, category, tags, required_tools}``, and
optionally ``example`` (a command line), ``config`` (the saga.toml it needs) and
``setup`` (the shell commands that make an empty folder ready for the example: the
saga.toml stanza, a table with its rows, a git repository, a loopback server). It is
found by its file stem (``money-transfer``). Seed 001's template documents (``{id, name,
composition, metadata, validation}``) are found by their ``id``, and seed 003's skill
manifests (``SKILL.md``, or ``NAME/SKILL.md``) by their folder's name.
``SAGA_TEMPLATES`` (directories separated by ``os.pathsep``) or saga.toml ``templates =
["dir", ...]`` add folders of one's own; they are searched before the built-in folder, so
a file of the same stem overrides a built-in.

How often each template ran, and how well, is :mod:`saga.report`'s business.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata as package_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga.composition.definition import load_file
from saga.composition.text import is_skill
from saga.config import Settings
from saga.errors import ConfigError, DefinitionError, Problem
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
    setup: tuple[str, ...] = ()  # metadata.setup: shell commands run before the example
    long_description: str = ""  # a SKILL.md's markdown body
    error: str | None = None  # set when the file cannot be read as a composition

    def to_json(self) -> dict[str, Any]:
        """The template as plain JSON."""
        data = asdict(self)
        data.update(path=str(self.path), tags=list(self.tags),
                    required_tools=list(self.required_tools), inputs=list(self.inputs),
                    setup=list(self.setup))
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


def template_files(dirs: list[Path]) -> dict[str, Path]:
    """Every template file in the folders, by the name it is found by (its stem; for a
    seed 003 ``SKILL.md``, its folder's name), earlier folders first. A folder of skill
    folders (``skills/quality-gate/SKILL.md``) is a template folder too."""
    found: dict[str, Path] = {}
    for folder in dirs:
        for path in sorted(folder.iterdir()):
            if path.is_file() and (path.suffix in SUFFIXES or is_skill(path)):
                found.setdefault(folder.name if is_skill(path) else path.stem, path)
            elif path.is_dir():
                skill = next((p for p in sorted(path.iterdir()) if is_skill(p) and p.is_file()),
                             None)
                if skill is not None:
                    found.setdefault(path.name, skill)
    return found


_files = template_files


def template_document(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The composition inside a seed 001 template document (``{id, name, description,
    composition, metadata, validation}``), with the document's id, name, category, tags
    and required tools in its ``metadata``; None for any other document."""
    inner = data.get("composition")
    if not isinstance(inner, dict) or "steps" in data or "nodes" in data:
        return None
    composition = dict(inner)
    meta = dict(data["metadata"]) if isinstance(data.get("metadata"), dict) else {}
    validation = _table(data, "validation")
    meta.update({k: v for k, v in (("template_id", data.get("id")),
                                   ("title", data.get("name")),
                                   ("required_tools", validation.get("required_tools")),
                                   ("min_version", validation.get("min_version")))
                 if v is not None})
    own = composition.get("metadata")
    composition["metadata"] = {**meta, **(own if isinstance(own, dict) else {})}
    composition.setdefault("name", data.get("id") or data.get("name"))
    if data.get("description") is not None:
        composition.setdefault("description", data["description"])
    return composition


def template_problems(data: Mapping[str, Any],
                      tools: Collection[str] | Mapping[str, Any] | None) -> list[Problem]:
    """A seed 001 template's ``validation``, checked at load: each required tool is
    available (when the tools are known), and saga is at least its ``min_version``."""
    validation = _table(data, "validation")
    problems = []
    required = validation.get("required_tools") or []
    if tools is not None and isinstance(required, list):
        missing = [str(t) for t in required if str(t) not in tools]
        if missing:
            problems.append(Problem("validation.required_tools",
                                    f"needs the tool(s) {', '.join(missing)}, not available "
                                    "here (see `saga tools`)"))
    wanted = validation.get("min_version")
    if wanted is not None:
        ours = saga_version()
        if _version_key(str(wanted)) > _version_key(ours):
            problems.append(Problem("validation.min_version",
                                    f"needs saga {wanted} or newer; this is saga {ours}"))
    return problems


def _table(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def saga_version() -> str:
    """The installed saga's version."""
    try:
        return package_metadata.version("saga")
    except package_metadata.PackageNotFoundError:
        return "0"


def _version_key(text: str) -> tuple[int, ...]:
    """``1.2.0`` -> (1, 2, 0): numbers compared as numbers (``1.10`` after ``1.9``)."""
    return tuple(int(n) for n in re.findall(r"\d+", text)[:4]) or (0,)


def read_template(path: Path) -> TemplateInfo:
    """The metadata of one template file (``error`` set when it cannot be parsed)."""
    stem = path.parent.name if is_skill(path) else path.stem
    try:
        data = load_file(path)
    except DefinitionError as e:
        return TemplateInfo(stem, path, error=str(e))
    document, data = data, template_document(data) or data
    meta: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
    description = " ".join(str(document.get("description") or data.get("description")
                               or meta.get("description") or "").split())
    raw_inputs = data.get("inputs") or []
    if isinstance(raw_inputs, dict):
        raw_inputs = [{"name": k, **(v if isinstance(v, dict) else {"type": v})}
                      for k, v in raw_inputs.items()]
    inputs = tuple({k: spec.get(k) for k in ("name", "type", "required", "default",
                                             "description") if k in spec}
                   for spec in raw_inputs if isinstance(spec, dict))
    name = str(meta.get("template_id") or stem)
    return TemplateInfo(
        name=name, path=path, definition_name=str(data.get("name", "")),
        title=str(meta.get("title") or name.replace("-", " ").capitalize()),
        description=description, category=str(meta.get("category", "")),
        tags=tuple(str(t) for t in meta.get("tags") or ()),
        required_tools=tuple(str(t) for t in meta.get("required_tools") or ()),
        version=str(data.get("version", "")), inputs=inputs,
        example=" ".join(str(meta.get("example") or "").split()),
        config=str(meta.get("config") or ""),
        setup=_commands(meta.get("setup")),
        long_description=str(meta.get("long_description") or ""))


def _commands(value: Any) -> tuple[str, ...]:
    """``metadata.setup``: one shell command or a list of them."""
    if isinstance(value, str):
        value = [value]
    return tuple(str(c).strip() for c in value or () if str(c).strip())


def source_name(source: str | Path) -> str:
    """How an error names a composition file: a built-in template by its name
    (``template 'money-transfer'``), not by its path inside the installed package, which
    tells a user nothing they can open or fix; any other file by the path they gave."""
    path = Path(source)
    if path.suffix in SUFFIXES and path.parent.resolve() == TEMPLATES_DIR:
        return f"template {path.stem!r}"
    return str(source)


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
    for path in files.values():  # a seed 001 document is found by its id
        if path.suffix == ".json" and read_template(path).name == name:
            return path
    close = difflib.get_close_matches(stem, files, n=3, cutoff=0.5)
    close += [n for n in sorted(files) if stem and stem in n and n not in close][:3]
    hint = f"did you mean {', '.join(close)}?" if close else \
        f"known templates: {', '.join(sorted(files)) or 'none'}"
    raise ConfigError(f"unknown template {name!r}; {hint} (see `saga templates list`)")
