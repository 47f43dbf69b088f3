"""Reading what users write: YAML or JSON text into plain data, refusing what no store can
keep (duplicate keys, alias bombs, nesting past the parser, a NUL, a lone surrogate) with
a :class:`DefinitionError` that says where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from saga.errors import DefinitionError, Problem

#: How many nodes a document may expand to once its aliases are followed (a YAML
#: "billion laughs" file is a few lines that expand to billions).
MAX_EXPANDED_NODES = 200_000


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing duplicate keys (YAML's last-wins hides typos) and
    documents whose aliases expand beyond :data:`MAX_EXPANDED_NODES`."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes the document holds once every alias is expanded (shared nodes counted each
    time they are used)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once instead of forever
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(v, memo) for v in node.value)
    memo[id(node)] = min(size, MAX_EXPANDED_NODES + 1)
    return memo[id(node)]


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicate = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if duplicate is not None:
        raise ValueError(f"duplicate key {duplicate!r}")
    return dict(pairs)


def parse_text(text: str, source: str = "<text>") -> dict[str, Any]:
    """Parse JSON or YAML text into a mapping, or raise DefinitionError.

    JSON is read as JSON first (so ``\\ud83d\\ude00`` escapes, as Python's ``json.dumps``
    writes them, are one character); anything else as YAML. Either way a duplicate key is
    an error, and so is a document that expands beyond :data:`MAX_EXPANDED_NODES` nodes.
    """
    try:
        data = _parse(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        detail = getattr(e, "problem", None) or " ".join(str(e).split())
        raise DefinitionError([Problem(where, f"not valid YAML/JSON: {detail}")], source) from e
    except (ValueError, RecursionError) as e:
        detail = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise DefinitionError([Problem("", f"not valid YAML/JSON: {detail}")], source) from e
    if not isinstance(data, dict):
        raise DefinitionError([Problem("", "a composition must be a mapping")], source)
    problems = text_problems(data)
    if problems:
        raise DefinitionError(problems, source)
    return data


def _parse(text: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_pairs_without_duplicates)
        except json.JSONDecodeError:
            pass  # YAML's flow style also starts with "{"
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_EXPANDED_NODES:
            raise ValueError(f"the document expands to more than {MAX_EXPANDED_NODES} nodes "
                             "through its aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def text_problems(data: Any, path: str = "", *, nul: bool = True) -> list[Problem]:
    """Text no store can keep as a name or value, anywhere: a NUL character (unless
    ``nul`` is false), or a lone surrogate (JSON may escape one, ``"\\ud800"``; it is no
    UTF-8 text)."""
    if isinstance(data, str):
        return [Problem(path, bad)] if (bad := _bad_text(data, nul)) else []
    if isinstance(data, dict):
        problems = []
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (bad := _bad_text(key, nul)):
                problems.append(Problem(path, f"a key {bad}"))
                where = path
            problems += text_problems(value, where, nul=nul)
        return problems
    if isinstance(data, list):
        return [p for i, v in enumerate(data)
                for p in text_problems(v, f"{path}[{i}]", nul=nul)]
    return []


def _bad_text(text: str, nul: bool) -> str | None:
    if nul and "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text (it has a lone surrogate)"
    return None


#: Seed 003's manifest keys: on a SKILL.md's front matter they speak for its steps.
_SKILL_STEP_KEYS = ("layer", "blocks-on-failure", "eco-mode-skip")


def parse_skill(text: str, source: str = "<text>", folder: str = "") -> dict[str, Any]:
    """A SKILL.md (seed 003): the YAML front matter between ``---`` lines is the
    composition, the markdown after it its long description (kept in
    ``metadata.long_description``).

    The seed's manifest keys may sit on the front matter itself: ``layer``,
    ``blocks-on-failure`` and ``eco-mode-skip`` then hold for each step that does not say
    otherwise, and ``dependencies`` (the skills this one needs) is kept in ``metadata``.
    A manifest without ``steps`` (the seed's, as written) is a one-step composition
    calling its ``tool`` (with ``args``), else the tool of the skill's own name (a Python
    tool or ``--tools`` module providing it); ``name`` defaults to the folder's name.
    """
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    ends = [i for i, line in enumerate(lines) if line.rstrip() == "---"]
    if not lines or lines[0].rstrip() != "---" or len(ends) < 2:
        raise DefinitionError([Problem("", "a SKILL.md starts with YAML front matter "
                                           "between two '---' lines")], source)
    data = parse_text("".join(lines[1:ends[1]]), source)
    body = "".join(lines[ends[1] + 1:]).strip()
    manifest = {k: data.pop(k) for k in (*_SKILL_STEP_KEYS, "dependencies") if k in data}
    if "steps" not in data and "nodes" not in data:  # one skill: one step
        name = str(data.get("name") or folder or "skill")
        step = {"id": name, "tool": data.pop("tool", None) or name}
        step.update({k: data.pop(k) for k in ("args", "parameters") if k in data})
        data["steps"] = [step]
    if isinstance(data.get("steps"), list):
        data["steps"] = [{**_step_defaults(manifest, step), **step}
                         if isinstance(step, dict) else step for step in data["steps"]]
    if folder:
        data.setdefault("name", folder)
    if manifest or body:
        metadata = data.setdefault("metadata", {})
        if isinstance(metadata, dict):
            if manifest:
                metadata.setdefault("skill", manifest)
            if body:
                metadata.setdefault("long_description", body)
    return data


def _step_defaults(manifest: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """The manifest's keys a step takes (a step's own ``on_error`` overrides
    ``blocks-on-failure``, which says the same thing)."""
    return {k: v for k, v in manifest.items() if k in _SKILL_STEP_KEYS
            and not (k == "blocks-on-failure" and "on_error" in step)}


def is_skill(path: Path) -> bool:
    """True for a seed 003 skill manifest (a file named ``SKILL.md``, any case)."""
    return path.name.lower() == "skill.md"


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a composition file (``.yaml``, ``.yml``, ``.json``, or a seed 003
    ``SKILL.md`` with front matter) into raw data."""
    if "\x00" in str(path):  # no file system has such a name (open() raises ValueError)
        raise DefinitionError([Problem("", "the file name contains a NUL character")])
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DefinitionError([Problem("", f"cannot read file: {e.strerror}")], str(path)) from e
    except UnicodeDecodeError as e:
        raise DefinitionError([Problem("", f"not UTF-8 text: {e.reason} at byte {e.start}")],
                              str(path)) from e
    if is_skill(path):
        return parse_skill(text, str(path), path.resolve().parent.name)
    return parse_text(text, str(path))
