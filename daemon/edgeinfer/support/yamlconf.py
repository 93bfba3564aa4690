"""YAML → validated pydantic model, with errors that name the key and the line.

Used for both the daemon's configuration and a bundle's model.yaml: one place
that turns "validation failed" into `edgeinferd.yaml:12: streams[0].max_age_ms:
Input should be greater than 0`.
"""
from __future__ import annotations

from typing import Any, TypeVar

import pydantic
import yaml

M = TypeVar("M", bound=pydantic.BaseModel)

# Bounds on what a document may make the loader do: a model.yaml is a signed but still foreign file, and
# the key-line index, pydantic and the decoders walk aliases expanded (a "billion laughs" of 200 bytes is
# 10^9 values) and recurse into nesting (PyYAML's composer too).
MAX_DEPTH = 64                  # collections inside collections; a real file uses about 4
MAX_ALIAS_VALUES = 100_000      # values that aliases may add, all expansions together
MAX_PROBLEMS_SHOWN = 20         # a message stays readable; `problems` keeps them all


class ConfigError(ValueError):
    """A configuration or model.yaml problem; the message lists every error with key and line."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        shown = [f"  {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
        super().__init__(f"{source}: invalid:\n" + "\n".join(shown))


class _Loader(yaml.SafeLoader):
    """SafeLoader whose scalar errors (`2001-13-45` as a date, `!!int 0xZZ`) are YAML errors with the
    line, not a bare ValueError from the constructor."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as e:
            raise yaml.constructor.ConstructorError(None, None, str(e), node.start_mark) from None


def _bounded(text: str) -> None:
    """Raises a YAML error (with the line) for nesting deeper than MAX_DEPTH, an alias inside its own
    anchor, or aliases adding more than MAX_ALIAS_VALUES values; from the event stream, which PyYAML
    parses without recursion, before anything builds or walks a tree."""
    stack: list[list] = []      # open collections: [values so far, anchor]
    sizes: dict[str, int] = {}  # anchor -> values of its node, expanded
    added = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= MAX_DEPTH:
                raise yaml.MarkedYAMLError(problem=f"nested more than {MAX_DEPTH} levels deep",
                                           problem_mark=ev.start_mark)
            stack.append([1, ev.anchor])
            continue
        if isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            n, anchor = stack.pop()
        elif isinstance(ev, yaml.ScalarEvent):
            n, anchor = 1, ev.anchor
        elif isinstance(ev, yaml.AliasEvent):
            if any(a == ev.anchor for _, a in stack):
                raise yaml.MarkedYAMLError(problem=f"alias *{ev.anchor} inside its own anchor (a recursive "
                                           "structure)", problem_mark=ev.start_mark)
            n, anchor = sizes.get(ev.anchor, 1), None  # an undefined alias: the composer says so
            added += n
            if added > MAX_ALIAS_VALUES:
                raise yaml.MarkedYAMLError(problem=f"aliases expand to more than {MAX_ALIAS_VALUES} values",
                                           problem_mark=ev.start_mark)
        else:
            continue
        if anchor is not None:
            sizes[anchor] = n
        if stack:
            stack[-1][0] += n


def _line_index(node: yaml.Node, path: tuple = (), out: dict | None = None, repeated: list | None = None) -> dict:
    """Maps every key path (as pydantic reports it) to the 1-based YAML line;
    keys given twice in one mapping go to `repeated` (YAML would keep the last silently)."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key, value in node.value:
            k = (*path, key.value)
            line = key.start_mark.line + 1
            if repeated is not None and isinstance(key.value, str) and key.value in seen:
                repeated.append((k, line, seen[key.value]))
            seen.setdefault(key.value, line)
            out[k] = line
            _line_index(value, k, out, repeated)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, (*path, i), out, repeated)
    return out


def clip(text: str, limit: int = 64) -> str:
    """`text` as a message shows a value from a file: whole if short, else its start and its length
    (a 900 KiB name in a signed model.yaml must not become a 900 KiB log line)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _dotted(loc: tuple) -> str:
    s = ""
    for part in loc:
        part = part if isinstance(part, int) else clip(str(part))
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s or "(top level)"


def load_yaml_model(model: type[M], text: str, source: str) -> M:
    """Parses YAML text and validates it into `model`; raises ConfigError."""
    try:
        _bounded(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(source, [f"{source}{where}: not valid YAML: {getattr(e, 'problem', e)}"]) from None
    if data is None:
        data = {}
    repeated: list = []
    lines = _line_index(node, repeated=repeated) if node is not None else {}
    if repeated:
        raise ConfigError(source, [f"{source}:{line}: {_dotted(k)}: repeated key (first given at line {first})"
                                   for k, line, first in repeated])
    try:
        obj = model.model_validate(data)
    except pydantic.ValidationError as e:
        problems = []
        for err in e.errors():
            loc = _yaml_loc(lines, tuple(err["loc"]))
            line = _line_of(lines, loc)
            msg = err["msg"]
            ctx = err.get("ctx") or {}
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] in ("union_tag_not_found", "union_tag_invalid"):
                # A section whose schema a key chooses (model.yaml's decoder, by its type): name that key.
                loc = (*loc, ctx.get("discriminator", "type").strip("'"))
                line = _line_of(lines, loc)
                msg = "Field required" if err["type"] == "union_tag_not_found" else \
                    f"unknown {clip(repr(ctx.get('tag')))}; known: {ctx.get('expected_tags')}"  # clipped, as values are
            problems.append(f"{source}:{line or '?'}: {_dotted(loc)}: {msg}")
        raise ConfigError(source, problems) from None
    # Checks across sections (e.g. a stream naming a model that is not configured): errors with their lines.
    cross_checks = getattr(obj, "cross_checks", None)
    if cross_checks is not None:
        problems = [f"{source}:{_line_of(lines, loc) or '?'}: {_dotted(loc)}: {msg}" for loc, msg in cross_checks()]
        if problems:
            raise ConfigError(source, problems)
    # Rules across sections (whom a stream trusts depends on shm): refused with their lines, as pydantic's are.
    refusals = getattr(obj, "refusals", None)
    if refusals is not None:
        problems = [f"{source}:{_line_of(lines, loc) or '?'}: {_dotted(loc)}: {msg}" for loc, msg in refusals()]
        if problems:
            raise ConfigError(source, problems)
    # Keys accepted only for compatibility: warnings with their lines, kept on the model.
    deprecations = getattr(obj, "deprecations", None)
    if deprecations is not None:
        obj._warnings = [f"{source}:{_line_of(lines, loc) or '?'}: {_dotted(loc)}: {msg}"
                         for loc, msg in deprecations()]
    return obj


def _yaml_loc(lines: dict, loc: tuple) -> tuple:
    """pydantic's error path as the file spells it: a tagged union (model.yaml's `decoder:`, chosen by its
    `type`) adds the tag as a path element the YAML does not have; it is left out where the key after it is
    in the file."""
    kept: tuple = ()
    for i, part in enumerate(loc):
        if (*kept, part) not in lines and i + 1 < len(loc) and (*kept, loc[i + 1]) in lines:
            continue
        kept = (*kept, part)
    return kept


def _line_of(lines: dict, loc: tuple) -> int | None:
    """The line of the deepest key of `loc` that exists in the file."""
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def load_yaml_file(model: type[M], path: str) -> M:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(path, [f"{path}: cannot read: {e.strerror}"]) from None
    return load_yaml_model(model, text, path)
