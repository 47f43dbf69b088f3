"""mkdocs hooks: the documentation's reference pages, generated from the code at build time.

``mkdocs.yml`` names this module under ``hooks:``. A page asks for a generated part with
a marker on a line of its own, which :func:`on_page_markdown` replaces:

- ``<!-- reference:cli -->``: every command, subcommand and option of the ``saga`` click
  group (``saga.cli.main``), with its help text;
- ``<!-- reference:http -->``: every operation of the OpenAPI document of the app that
  ``saga serve`` runs (``saga.server.app.create_app``);
- ``<!-- reference:composition -->`` and ``<!-- reference:graph -->``: every key of the
  composition models' JSON Schema (``saga.composition.definition.Definition``, and
  ``saga.composition.graph_model.WorkflowGraph`` for the graph form);
- ``<!-- reference:events -->``: every event type a run records, with its fields.

:func:`on_files` publishes the schema as ``schema/composition.json`` (editors validate
YAML against it) and the OpenAPI document as ``reference/openapi.json``. Nothing is
written into ``docs/``, so the generated text cannot go stale in the repository.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

SCHEMA_PATH = "schema/composition.json"
OPENAPI_PATH = "reference/openapi.json"
_MARKER = re.compile(r"^<!-- reference:(\w+) -->$", re.M)


def plain(text: str) -> str:
    """The code's docstrings name the formats they implement by the project's internal
    names ("seed 002"); a reader needs only what the format is, which the text around
    says, so those names are dropped from what the site shows."""
    text = re.sub(r"\s*\([Ss]eeds? \d{3}[^)]*\)", "", text)
    text = re.sub(r"\b[Ss]eeds? \d{3}'s (\S)", lambda m: m.group(1).upper(), text)
    return re.sub(r"\b[Ss]eeds? \d{3}: (\S)", lambda m: m.group(1).upper(), text)


# --- the command line -------------------------------------------------------------------

def commands() -> list[tuple[str, click.Command]]:
    """Every command of the ``saga`` group, depth first: ``("saga schedule add", cmd)``."""
    from saga.cli import main

    found: list[tuple[str, click.Command]] = []

    def walk(name: str, cmd: click.Command, parent: click.Context | None) -> None:
        found.append((name, cmd))
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd, info_name=name.split()[-1], parent=parent)
            for sub in cmd.list_commands(ctx):
                child = cmd.get_command(ctx, sub)
                if child is not None and not child.hidden:
                    walk(f"{name} {sub}", child, ctx)

    walk("saga", main, None)
    return found


def _anchor(command: str) -> str:
    return command.replace(" ", "-")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option_row(param: click.Parameter) -> str:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if isinstance(param, click.Option) and param.is_flag:
        kind = "flag"
    else:
        kind = _cell(param.type.name if not isinstance(param.type, click.Choice)
                     else " | ".join(map(str, param.type.choices)))
    if getattr(param, "multiple", False):
        kind += ", repeatable"
    default = param.default
    unset = callable(default) or repr(default).startswith("Sentinel.")  # click 8.3: UNSET
    shown = "" if unset or default in (None, (), [], False) else f"`{default}`"
    help_text = _cell(getattr(param, "help", None) or "")
    envvar = getattr(param, "envvar", None)
    if envvar and str(envvar) not in help_text:
        help_text += f" (env: `{envvar}`)"
    return f"| {names} | {kind} | {shown} | {help_text} |"


def cli_markdown() -> str:
    """The command-line reference: a table of every command, then one section per
    command with its usage, help and options."""
    out = ["| command | what it does |", "| --- | --- |"]
    out.extend(f"| [`{name}`](#{_anchor(name)}) | {_cell(cmd.get_short_help_str(limit=300))} |"
               for name, cmd in commands()[1:])
    out.append("")
    for name, cmd in commands():
        depth = min(name.count(" ") + 1, 4)
        out.append(f"{'#' * (depth + 1)} `{name}` {{ #{_anchor(name)} }}\n")
        ctx = click.Context(cmd, info_name=name)
        pieces = cmd.collect_usage_pieces(ctx)
        out.append(f"```text\n{name} {' '.join(pieces)}\n```\n")
        if cmd.help:
            out.append(_help_text(cmd.help) + "\n")
        options = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
        if options:
            out.append("| option | takes | default | what it does |\n| --- | --- | --- | --- |")
            out.extend(_option_row(p) for p in options)
            out.append("| `-h`, `--help` | flag | | show the command's help and exit |\n")
        if isinstance(cmd, click.Group):
            subs = [n for n, _ in commands() if n.startswith(name + " ")
                    and n.count(" ") == name.count(" ") + 1]
            out.append("Commands: " + ", ".join(f"`{s}`" for s in subs) + ".\n")
    return "\n".join(out)


def _help_text(text: str) -> str:
    """A docstring as click shows it: ``\\b`` paragraphs verbatim, examples as code."""
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text.strip())]
    rendered = []
    for para in paragraphs:
        if para.lstrip().startswith("\b"):
            body = para.lstrip()[1:].strip("\n")
            rendered.append("```text\n" + _dedent(body) + "\n```")
        else:
            rendered.append(" ".join(para.split()))
    return "\n\n".join(rendered)


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


# --- the HTTP API -----------------------------------------------------------------------

@functools.cache
def openapi() -> dict[str, Any]:
    """The OpenAPI document of the app ``saga serve`` runs (no store is opened for it)."""
    from saga.config import Settings
    from saga.server.app import create_app

    with tempfile.TemporaryDirectory() as home:
        app = create_app(Settings(home=Path(home) / ".saga"), worker=False)
        return app.openapi()


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    return f"`{schema.get('type', 'any')}`"


def http_markdown() -> str:
    """The HTTP reference: each path and method with its parameters, body and answers."""
    doc = openapi()
    out = [f"OpenAPI {doc['openapi']}, API version {doc['info']['version']}. The whole "
           f"document: [openapi.json](openapi.json).\n"]
    for path, methods in doc["paths"].items():
        out.append(f"### `{path}`\n")
        for method, op in methods.items():
            out.append(f"**{method.upper()} `{path}`**: {op.get('summary', '')}\n")
            if op.get("description"):
                out.append(_help_text(op["description"]) + "\n")
            params = op.get("parameters", [])
            if params:
                out.append("| parameter | in | type | required |\n| --- | --- | --- | --- |")
                out.extend(f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema', {}))} "
                           f"| {'yes' if p.get('required') else 'no'} |" for p in params)
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out.append(f"Body (`{media}`): {_schema_name(content.get('schema', {}))}\n")
            answers = ", ".join(f"{code} {_cell(r.get('description', ''))}"
                                for code, r in op.get("responses", {}).items())
            out.append(f"Answers: {answers}.\n")
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out.append("## Bodies\n")
        for name, schema in schemas.items():
            out.append(f"### {name}\n")
            out.append(_properties_table(schema, schemas))
    return "\n".join(out)


# --- the composition language -----------------------------------------------------------

def _alternate_spellings(schema: dict[str, Any]) -> None:
    """Let the schema accept every spelling the loader accepts: a field written by its
    name or its alias (``parameters``/``args``), ``dependencies`` for ``depends_on`` and
    ``blocks-on-failure`` for ``on_error``, and a compensation given as a tool's name or
    ``true``/``false``."""
    from saga.composition.definition import Definition, Step, ToolCall

    defs = schema["$defs"]
    for model in (Definition, Step, ToolCall):
        props = schema["properties"] if model is Definition else defs[model.__name__][
            "properties"]
        for name, field in model.model_fields.items():
            if field.alias and field.alias in props and name not in props:
                props[name] = copy.deepcopy(props[field.alias])
    step = defs["Step"]["properties"]
    step["dependencies"] = copy.deepcopy(step["depends_on"])
    step["blocks-on-failure"] = {"type": "boolean", "title": "Blocks-On-Failure",
                                 "description": "true is on_error: fail, false is continue"}
    call = {"anyOf": [{"$ref": "#/$defs/ToolCall"}, {"type": "string"}, {"type": "boolean"},
                      {"type": "null"}]}
    step["compensate"] = call
    defs["HealHandler"]["properties"]["do"]["items"] = {
        "anyOf": [{"$ref": "#/$defs/ToolCall"}, {"type": "string"}]}
    # A file without a name is named by its stem; inputs may be a mapping of name: spec.
    schema["required"] = [r for r in schema.get("required", []) if r != "name"]
    schema["properties"]["inputs"] = {"anyOf": [schema["properties"]["inputs"],
                                                {"type": "object"}]}


@functools.cache
def composition_schema() -> dict[str, Any]:
    """One JSON Schema for both forms of a composition: the step-list form (a document
    with ``steps``) or the graph form (``nodes`` and ``edges``)."""
    from saga.composition.definition import Definition
    from saga.composition.graph_model import WorkflowGraph

    steps = Definition.model_json_schema(by_alias=True)
    _alternate_spellings(steps)
    graph = WorkflowGraph.model_json_schema(by_alias=True)
    defs: dict[str, Any] = {}
    for prefix, part in (("", steps), ("Graph", graph)):
        text = json.dumps(part)
        for name in part.get("$defs", {}):
            if prefix:
                text = text.replace(f'"#/$defs/{name}"', f'"#/$defs/{prefix}{name}"')
        renamed = json.loads(text)
        for name, sub in renamed.pop("$defs", {}).items():
            defs[prefix + name] = sub
        defs[prefix + ("StepList" if not prefix else "Form")] = renamed
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://saga-run.github.io/saga/" + SCHEMA_PATH,
        "title": "saga composition",
        "description": "A saga composition: the step-list form (steps) or the graph form "
                       "(nodes and edges).",
        "oneOf": [{"$ref": "#/$defs/StepList"}, {"$ref": "#/$defs/GraphForm"}],
        "$defs": defs,
    }


def _kind(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        kinds = [_kind(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds))
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if schema.get("type") == "array":
        return f"list of {_kind(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def _properties_table(model: dict[str, Any], defs: dict[str, Any]) -> str:
    required = set(model.get("required", []))
    rows = ["| key | type | default | notes |", "| --- | --- | --- | --- |"]
    for key, prop in model.get("properties", {}).items():
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else (
            "required" if key in required else "")
        notes = [prop.get("description", "")]
        for bound in ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength",
                      "pattern", "minItems"):
            if bound in prop:
                notes.append(f"{bound} `{prop[bound]}`")
        rows.append(f"| `{key}` | {_kind(prop)} | {default} | "
                    f"{_cell('; '.join(n for n in notes if n))} |")
    description = model.get("description", "")
    head = _cell(description) + "\n\n" if description else ""
    return head + "\n".join(rows) + "\n"


def schema_markdown(form: str) -> str:
    """Every key of one form of the composition language, model by model."""
    schema = composition_schema()
    defs = schema["$defs"]
    top = "GraphForm" if form == "graph" else "StepList"
    names = [top, *sorted(n for n in defs if n not in ("StepList", "GraphForm")
                          and n.startswith("Graph") == (form == "graph"))]
    out = []
    for name in names:
        title = "The document" if name == top else name
        anchor = "" if name == top else f" {{ #{name.lower()} }}"
        out.append(f"### {title}{anchor}\n")
        out.append(_properties_table(defs[name], defs))
    return "\n".join(out)


# --- the event log ----------------------------------------------------------------------

def events_markdown() -> str:
    """Every event type a run records (``saga.domain.vocabulary.EVENT_TYPES``), with its
    docstring and its payload's fields, from the ``Run`` aggregate's event classes."""
    from saga.domain.run import Run
    from saga.domain.vocabulary import EVENT_TYPES

    base = inspect.get_annotations(Run.Event)
    out = ["Every event also carries " + ", ".join(f"`{f}`" for f in base) + " (the audit "
           "chain: see [Audit and reports](../howto/audit.md)), and the run's id, its version "
           "and a timestamp.\n",
           "| event | payload | what it records |", "| --- | --- | --- |"]
    for name in EVENT_TYPES:
        cls = getattr(Run, name)
        fields = [f for f in inspect.get_annotations(cls) if f != "TOPIC"]
        doc = _cell(cls.__doc__ or "")
        out.append(f"| `{name}` | {', '.join(f'`{f}`' for f in fields)} | {doc} |")
    return "\n".join(out) + "\n"


# --- mkdocs events ----------------------------------------------------------------------

def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Publish the composition schema and the OpenAPI document beside the pages."""
    files.append(File.generated(config, SCHEMA_PATH,
                                content=plain(json.dumps(composition_schema(), indent=2)) + "\n"))
    files.append(File.generated(config, OPENAPI_PATH,
                                content=json.dumps(openapi(), indent=2) + "\n"))
    return files


_GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "http": http_markdown,
    "composition": lambda: schema_markdown("composition"),
    "graph": lambda: schema_markdown("graph"),
    "events": events_markdown,
}


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Replace each ``<!-- reference:NAME -->`` line with the generated reference."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in _GENERATORS:
            raise ValueError(f"{page.file.src_path}: no generated reference named {name!r}")
        return plain(_GENERATORS[name]())
    return _MARKER.sub(fill, markdown)
