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


class ConfigError(ValueError):
    """A configuration or model.yaml problem; the message lists every error with key and line."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid:\n" + "\n".join(f"  {p}" for p in problems))


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


def _dotted(loc: tuple) -> str:
    s = ""
    for part in loc:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s or "(top level)"


def load_yaml_model(model: type[M], text: str, source: str) -> M:
    """Parses YAML text and validates it into `model`; raises ConfigError."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(text)
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
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            problems.append(f"{source}:{line or '?'}: {_dotted(loc)}: {msg}")
        raise ConfigError(source, problems) from None
    # Checks across sections (e.g. a stream naming a model that is not configured): errors with their lines.
    cross_checks = getattr(obj, "cross_checks", None)
    if cross_checks is not None:
        problems = [f"{source}:{_line_of(lines, loc) or '?'}: {_dotted(loc)}: {msg}" for loc, msg in cross_checks()]
        if problems:
            raise ConfigError(source, problems)
    # Keys accepted only for compatibility: warnings with their lines, kept on the model.
    deprecations = getattr(obj, "deprecations", None)
    if deprecations is not None:
        obj._warnings = [f"{source}:{_line_of(lines, loc) or '?'}: {_dotted(loc)}: {msg}" for loc, msg in deprecations()]
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
