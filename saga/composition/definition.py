"""What users write: pydantic models of a composition (read from YAML or JSON by
:mod:`saga.composition.text`, whose ``load_file``, ``parse_text`` and ``text_problems``
are re-exported here).

The step-list form is accepted exactly as users' documents write it (JSON with
``parameters``/``output_key``/``depends_on``; YAML with ``args``/``output``/``condition``),
and normalised to one canonical shape that is recorded in ``RunStarted``. Unknown keys are
errors, so a typo never passes silently. Every problem is collected and raised at once.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from saga.chain import definition_hash
from saga.composition.notify import NotifyTarget
from saga.composition.text import load_file as load_file
from saga.composition.text import parse_text as parse_text
from saga.composition.text import text_problems as text_problems
from saga.errors import InputError, Problem
from saga.lazy import lazy

if TYPE_CHECKING:
    import difflib
else:
    difflib = lazy("difflib")  # only a misspelt name needs it

InputType = Literal["string", "integer", "number", "boolean", "array", "object", "any"]
FailureStrategy = Literal["fail_fast", "partial_success", "rollback", "retry"]
_ON_ERROR = re.compile(r"^(fail|continue|compensate|retry:\d+)$")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: float | str) -> float | None:
    """Seconds from a number or a duration text (``90``, ``"90s"``, ``"10m"``, ``"2h"``,
    ``"1d"``, ``"250ms"``); None when it is neither (or negative)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    match = _DURATION.match(str(value))
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None


#: The longest input text a ``pattern`` is matched against.
MAX_PATTERN_INPUT = 10_000


def _nested_quantifier(pattern: str) -> bool:
    """True when a repeated group holds a repetition or an alternation: the shape of the
    patterns whose backtracking explodes (``(a+)+``, ``(a|aa)*``, ``(\\w+\\s?)*``)."""
    stack: list[bool] = []  # per open group: does it contain a quantifier or "|"?
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a character class: skip to its end
            i += 2 if pattern[i + 1:i + 2] == "]" else 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "(":
            stack.append(False)
        elif c == ")" and stack:
            risky = stack.pop()
            if risky and pattern[i + 1:i + 2] in ("*", "+", "{"):
                return True
            if stack:
                stack[-1] = stack[-1] or risky
        elif c in "*+{|?" and stack and c != "?":
            stack[-1] = True
        i += 1
    return False


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class InputSpec(_Model):
    """One declared input: its type and the constraints a value must meet."""

    name: str
    type: InputType = "string"
    required: bool = False
    default: Any = None
    description: str | None = None
    enum: list[Any] | None = None
    pattern: str | None = None
    max_length: int | None = Field(default=None, ge=0)
    min_length: int | None = Field(default=None, ge=0)
    minimum: float | None = None
    maximum: float | None = None
    secret: bool = False

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"pattern does not compile: {e}") from e
            if _nested_quantifier(value):
                raise ValueError("pattern repeats a group that itself repeats or "
                                 "alternates (like (a+)+): matching it can take exponential "
                                 "time; write it without the nested repetition")
        return value

    @model_validator(mode="after")
    def _default_fits(self) -> InputSpec:
        if self.default is not None:
            problems = check_value(self, self.default)
            if problems:
                raise ValueError(f"default {self.default!r} is invalid: {problems[0]}")
        return self


class RetryPolicy(_Model):
    """How a failed attempt is retried: count, backoff, jitter and which errors qualify."""

    max_attempts: int = Field(default=3, ge=1, le=100)
    backoff: Literal["exponential", "fixed", "linear"] = "exponential"
    delay: float = Field(default=0.2, ge=0, description="first wait, seconds")
    multiplier: float = Field(default=2.0, ge=1)
    max_delay: float = Field(default=30.0, ge=0)
    jitter: float = Field(default=0.1, ge=0, description="up to this many seconds added")
    retry_on: list[str] | None = None
    non_retryable: list[str] = Field(default_factory=list)


class ToolCall(_Model):
    """A tool and its (templated) parameters; the shape of a step's compensation.

    ``compensate: true`` on a step means "the step tool's own compensation", called with
    the step's recorded parameters and output; it is stored as a call with no tool.
    """

    tool: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict, alias="args")
    timeout_ms: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        if data is True:
            return {}
        return {"tool": data} if isinstance(data, str) else data

    @property
    def uses_tool_compensation(self) -> bool:
        """True when the step's own tool provides the compensation."""
        return self.tool is None


class HealHandler(_Model):
    """Auto-heal (seed 002): when a failed attempt's ``error`` matches ``when``, run the
    remedy calls in ``do``, then retry the step; at most ``max`` times per step."""

    when: str
    do: list[ToolCall] = Field(min_length=1)
    max: int = Field(default=1, ge=1, le=10)


class Step(_Model):
    """One step of the step-list form: a tool call or a compute block, and its policies."""

    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$", max_length=100)
    description: str | None = None
    tool: str | None = None
    compute: str | None = None
    use: str | None = Field(default=None, min_length=1)
    # A mapping, or one whole-value template that renders to a mapping at run time
    # (``"{{ steps.prepare }}"``): the parameters a step builds from earlier outputs.
    parameters: dict[str, Any] | str = Field(default_factory=dict, alias="args")
    depends_on: list[str] | None = None
    output_key: str | None = Field(default=None, alias="output", max_length=100)
    condition: str | None = Field(default=None, alias="when")
    expect: str | None = None
    cache: float | None = Field(default=None, gt=0, description="seconds to reuse the output")
    secret_outputs: bool = Field(default=False, description="keep the output out of the log")
    heal: list[HealHandler] = Field(default_factory=list)
    timeout_ms: int | None = Field(default=None, gt=0)
    timeout: float | None = Field(default=None, gt=0, description="seconds")
    retry_count: int | None = Field(default=None, ge=0, le=100)
    retry: RetryPolicy | None = None
    on_error: str = "fail"
    compensate: ToolCall | None = None
    loop: str | list[Any] | None = None
    loop_var: str = Field(default="item", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    loop_concurrency: int | None = Field(default=None, ge=1)
    until: str | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=10_000)
    idempotent: bool = False
    on_interrupt: Literal["retry", "fail", "compensate"] = "retry"
    parallel_group: str | int | None = None
    layer: Literal["guarantee", "enhancement", "execution"] | None = None
    confirm: bool | str | None = None
    sleep: float | str | None = Field(default=None, description="seconds, or '10m', '2h'")
    signal: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")
    eco_skip: bool | None = Field(default=None, alias="eco-mode-skip",
                                  description="skipped in eco mode (default: enhancements)")
    resource: str | list[str] | None = Field(
        default=None, description="the resources (saga.toml [resources.NAME]) each call "
                                  "of this step counts against")
    pool: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                             description="only workers started with --pool NAME run it")
    heartbeat_timeout: float | str | None = Field(
        default=None, description="an attempt whose tool sends no ctx.heartbeat for this "
                                  "long fails with HeartbeatTimeout: seconds or '5m'")

    @model_validator(mode="before")
    @classmethod
    def _manifest_keys(cls, data: Any) -> Any:
        """Seed 003's skill-manifest spellings: ``dependencies`` is ``depends_on``, and
        ``blocks-on-failure: true|false`` is ``on_error: fail|continue``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "dependencies" in data:
            if "depends_on" in data:
                raise ValueError("give depends_on or dependencies, not both")
            data["depends_on"] = data.pop("dependencies")
        if "blocks-on-failure" in data:
            blocks = data.pop("blocks-on-failure")
            if not isinstance(blocks, bool):
                raise ValueError("blocks-on-failure is true or false")
            if "on_error" in data:
                raise ValueError("give on_error or blocks-on-failure, not both")
            data["on_error"] = "fail" if blocks else "continue"
        return data

    @field_validator("sleep", "heartbeat_timeout")
    @classmethod
    def _sleep_duration(cls, value: float | str | None) -> float | str | None:
        if value is not None and parse_duration(value) is None:
            raise ValueError("must be seconds (a number) or a duration such as '90s', '10m', "
                             "'2h', '1d'")
        return value

    @field_validator("compensate", mode="before")
    @classmethod
    def _no_compensation(cls, value: Any) -> Any:
        return None if value is False else value

    @field_validator("on_error")
    @classmethod
    def _on_error_form(cls, value: str) -> str:
        if not _ON_ERROR.match(value):
            raise ValueError("must be fail, continue, compensate or retry:N")
        return value

    @model_validator(mode="after")
    def _one_action(self) -> Step:
        if sum(x is not None for x in (self.tool, self.compute, self.use, self.sleep,
                                       self.signal)) != 1:
            raise ValueError("a step needs exactly one of 'tool', 'compute', 'use', 'sleep' "
                             "or 'signal'")
        if (self.sleep is not None or self.signal is not None) and (
                self.parameters or self.loop is not None or self.until is not None):
            raise ValueError("a sleep or signal step takes no parameters and cannot loop")
        if self.compute is not None and self.parameters:
            raise ValueError("a compute step takes no parameters")
        if isinstance(self.parameters, str) and not re.fullmatch(
                r"\s*\{\{.*\}\}\s*", self.parameters, re.DOTALL):
            raise ValueError("parameters are a mapping, or one '{{ expression }}' that "
                             "renders to a mapping")
        if self.loop is not None and self.compute is not None:
            raise ValueError("'loop' needs a tool or use step")
        if self.until is not None and (self.max_iterations is None or self.loop is not None
                                       or self.compute is not None):
            raise ValueError("'until' repeats a tool or use step and needs 'max_iterations' "
                             "(loops must be bounded); it cannot be combined with 'loop'")
        if self.compensate is not None and self.compensate.tool is None and self.compute:
            raise ValueError("'compensate: true' needs a tool step (it uses the tool's own "
                             "compensation)")
        return self

    @property
    def iterates(self) -> bool:
        """True for a for-each (``loop``) or repeat-until (``until``) step."""
        return self.loop is not None or self.until is not None

    @property
    def compensation(self) -> ToolCall | None:
        """How this step is undone: its ``compensate``, or, for a nested composition, the
        compensation of the child run (unless ``compensate: false``)."""
        if self.compensate is None and self.use is not None \
                and "compensate" not in self.model_fields_set:
            return ToolCall()
        return self.compensate

    @property
    def key(self) -> str:
        """The name this step's output is visible under: its output key, else its id."""
        return self.output_key or self.id

    @property
    def tolerates_failure(self) -> bool:
        """True when the run goes on after this step fails for good: ``on_error:
        continue``, or an enhancement-layer step that does not say otherwise."""
        if self.on_error == "continue":
            return True
        return self.layer == "enhancement" and "on_error" not in self.model_fields_set

    def explicit_choices(self) -> dict[str, Any]:
        """The explicitly written values equal to a default whose absence means something
        else, so a recorded definition (dumped without defaults) keeps them: ``on_error:
        fail`` (or ``blocks-on-failure: true``) on an enhancement step, which would
        otherwise fail soft, and ``compensate: false``, which would otherwise let a
        ``use`` step (or a tool with its own undo) compensate."""
        choices: dict[str, Any] = {}
        if self.layer == "enhancement" and "on_error" in self.model_fields_set:
            choices["on_error"] = self.on_error
        if self.compensate is None and "compensate" in self.model_fields_set:
            choices["compensate"] = False
        return choices

    @property
    def skipped_in_eco(self) -> bool:
        """True when eco mode skips this step: ``eco-mode-skip``, else enhancements."""
        return self.eco_skip if self.eco_skip is not None else self.layer == "enhancement"

    @property
    def sleep_seconds(self) -> float | None:
        """How long a ``sleep`` step waits, in seconds."""
        return None if self.sleep is None else parse_duration(self.sleep)

    @property
    def timeout_seconds(self) -> float | None:
        """The per-attempt timeout in seconds, from ``timeout_ms`` or ``timeout``."""
        if self.timeout_ms is not None:
            return self.timeout_ms / 1000
        return self.timeout


class ErrorHandling(_Model):
    """What the run does when a step fails for good."""

    max_retries: int = Field(default=0, ge=0, le=100)
    rollback_on_failure: bool = True
    failure_strategy: FailureStrategy = "fail_fast"


class Confirmation(_Model):
    """A confirmation asked before a step runs (seed 002's ``confirmations`` list)."""

    step: str
    message: str | None = None
    default: bool = True
    timeout: float | str | None = Field(default=None, description="seconds, or '1h': then "
                                                                  "`default` is applied")

    @field_validator("timeout")
    @classmethod
    def _timeout_duration(cls, value: float | str | None) -> float | str | None:
        if value is not None and not parse_duration(value):
            raise ValueError("must be a positive number of seconds or a duration such as "
                             "'90s', '10m', '1h'")
        return value


class Definition(_Model):
    """A composition in the step-list form."""

    name: str = Field(min_length=1, max_length=200)
    version: str = "1"
    description: str | None = None
    author: str | None = None
    inputs: list[InputSpec] = Field(default_factory=list)
    steps: list[Step] = Field(min_length=1)
    outputs: dict[str, Any] | None = None
    error_handling: ErrorHandling = Field(default_factory=ErrorHandling)
    max_concurrency: int = Field(default=8, ge=1, le=1024)
    confirmations: list[Confirmation] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    timeout: float | str | None = Field(default=None, description="the whole run's deadline: "
                                                                  "seconds or '2h'")
    queue: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    #: Webhooks told of this run's events (saga.composition.notify), besides saga.toml's.
    notify: list[NotifyTarget] = Field(default_factory=list)

    @field_validator("timeout")
    @classmethod
    def _timeout_duration(cls, value: float | str | None) -> float | str | None:
        if value is not None and not parse_duration(value):
            raise ValueError("must be a positive number of seconds or a duration such as "
                             "'90s', '10m', '2h'")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs_mapping(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return [
                {"name": name, **spec} if isinstance(spec, dict) else {"name": name, "type": spec}
                for name, spec in value.items()
            ]
        return value

    @property
    def explicit_graph(self) -> bool:
        """True once any step declares ``depends_on`` (even ``[]``): then order is the graph."""
        return any(step.depends_on is not None for step in self.steps)

    def step(self, step_id: str) -> Step:
        """The step with this id."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def to_json(self) -> dict[str, Any]:
        """The normalised definition as plain JSON (canonical field names, no defaults,
        except the explicit choices whose absence means something else: see
        :meth:`Step.explicit_choices`)."""
        data = self.model_dump(mode="json", exclude_defaults=True)
        for step, dumped in zip(self.steps, data["steps"], strict=True):
            dumped.update(step.explicit_choices())
        return data

    def digest(self) -> str:
        """sha256 of the canonical JSON of the normalised definition."""
        return definition_hash(self.to_json())


def build(data: dict[str, Any], source: str | None = None) -> tuple[Definition | None,
                                                                    list[Problem]]:
    """Validate raw data into a Definition; return it (or None) with every model problem."""
    try:
        return Definition.model_validate(data), []
    except ValidationError as e:
        return None, [_problem(err) for err in e.errors()]


def _problem(err: Any) -> Problem:
    path = ""
    for part in err["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("function-after[_one_action(), Step]",):
            path += f".{part}" if path else str(part)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key (not part of the composition language)"
        loc = tuple(err["loc"])
        close = did_you_mean(str(loc[-1]), _known_keys(Definition) if len(loc) == 1 else
                             _known_keys(Step) if loc[:1] == ("steps",) and len(loc) == 3
                             else _known_keys()) if loc else ""
        if close:
            message += f"; did you mean {close}?"
    elif isinstance(err.get("input"), bool) and err["type"] == "string_type":
        word = "yes/on/true" if err["input"] else "no/off/false"
        message += (f"; YAML reads an unquoted {word} as a boolean: write it in quotes "
                    f"(id: \"{'on' if err['input'] else 'no'}\")")
    return Problem(path, message)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The known names closest to a misspelt ``name``, quoted and joined by "or" ("" when
    none is close): ``'steps'`` for ``stepz``."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)
    return " or ".join(repr(c) for c in close)


def unknown_tool(name: str, tools: Iterable[str]) -> str:
    """What a composition is told about a tool that is not there: its name, and the
    available tools its spelling is close to."""
    # A registry's lazy view offers the tools it has loaded (the name's own provider was
    # asked when the name was looked up): listing them all would start every declared MCP
    # server, the ones the run never names included.
    loaded = getattr(tools, "loaded", None)
    close = did_you_mean(name, loaded() if callable(loaded) else tools)
    return f"unknown tool {name!r}" + (f"; did you mean {close}?" if close else "")


@functools.cache
def _known_keys(of: type[BaseModel] | None = None) -> frozenset[str]:
    """The keys of one model of the composition language (a step's, the document's), or
    of them all: what an unknown key is compared with, by its fields and their aliases."""
    keys: set[str] = set()
    models = [of] if of is not None else list(globals().values())
    for model in models:
        if isinstance(model, type) and issubclass(model, BaseModel) and model is not BaseModel:
            for name, info in model.model_fields.items():
                keys.add(name)
                if isinstance(info.alias, str):
                    keys.add(info.alias)
    return frozenset(keys)


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def check_value(spec: InputSpec, value: Any) -> list[str]:
    """Problems with one input value against its spec (empty when it fits)."""
    if spec.type != "any":
        types = _PY_TYPES[spec.type]
        if isinstance(value, bool) and bool not in types:
            return [f"expected {spec.type}, got boolean"]
        if not isinstance(value, types):
            return [f"expected {spec.type}, got {type(value).__name__}"]
    problems = []
    if spec.enum is not None and value not in spec.enum:
        problems.append(f"must be one of {spec.enum}")
    if isinstance(value, str):
        if spec.pattern is not None and len(value) > MAX_PATTERN_INPUT:
            problems.append(f"is too long ({len(value)} characters) to match against a "
                            f"pattern (at most {MAX_PATTERN_INPUT})")
        elif spec.pattern is not None and not re.search(spec.pattern, value):
            problems.append(f"does not match pattern {spec.pattern!r}")
        if spec.max_length is not None and len(value) > spec.max_length:
            problems.append(f"is longer than {spec.max_length} characters")
        if spec.min_length is not None and len(value) < spec.min_length:
            problems.append(f"is shorter than {spec.min_length} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if spec.minimum is not None and value < spec.minimum:
            problems.append(f"is less than {spec.minimum}")
        if spec.maximum is not None and value > spec.maximum:
            problems.append(f"is greater than {spec.maximum}")
    return problems


def coerce_text(spec: InputSpec | None, text: str) -> Any:
    """Turn a command-line ``KEY=VALUE`` string into the input's declared type."""
    kind = spec.type if spec else "any"
    if kind == "string":
        return text
    if kind == "boolean" and text.lower() in ("true", "yes", "1", "false", "no", "0"):
        return text.lower() in ("true", "yes", "1")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def resolve_inputs(definition: Definition, given: dict[str, Any]) -> dict[str, Any]:
    """Apply defaults and check every given input; raise InputError listing all problems.

    A composition that declares no inputs accepts any (seed 001 declares none but reads
    ``input.query``); one that declares inputs rejects unknown names, so typos surface.
    """
    unrecordable = [Problem(f"inputs.{p.path}" if p.path else "inputs", p.message)
                    for p in text_problems(given, nul=False)]
    if not definition.inputs:
        if unrecordable:
            raise InputError(unrecordable)
        return dict(given)
    specs = {spec.name: spec for spec in definition.inputs}
    problems = unrecordable + [Problem(f"inputs.{name}", "unknown input")
                               for name in given if name not in specs]
    resolved: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in given:
            value = given[name]
            problems += [Problem(f"inputs.{name}", msg) for msg in check_value(spec, value)]
            resolved[name] = value
        elif spec.required:
            problems.append(Problem(f"inputs.{name}", "is required"))
        else:
            resolved[name] = spec.default
    if problems:
        raise InputError(problems)
    return resolved
