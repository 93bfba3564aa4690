"""The shipped etc/edgeinfer/edgeinferd.yaml is the configuration's documentation: held here to the schema
(daemon/edgeinfer/config/schema.py), walked recursively, so that a key added to the schema fails these tests until the file
documents it.

The file's convention (stated at its top): every key appears. A key that is set shows its default; a
commented-out key ("# key: value", at the key's own indentation) has no default and shows an example.
Exceptions: required keys, and streams[].producer (EXAMPLES below). A prose comment therefore never starts
with a lower-case word and a colon, or it would read as a commented-out key.
"""
from __future__ import annotations

import grp
import pwd
import re
import typing

import pytest
import yaml
from pydantic import BaseModel

from conftest import ROOT
from edgeinfer.config import schema as config
from edgeinfer.config.schema import load_config
from edgeinfer.config.identity import Identity

SHIPPED = ROOT / "etc/edgeinfer/edgeinferd.yaml"

# Keys the file does not document as keys: the ABI 1 ones, named once in the comment that says they are
# accepted with a warning.
ABI1_KEYS = {("shm", "dir"): "shm.dir", ("shm", "allowed_uids"): "shm.allowed_uids",
             ("shm", "result_group"): "shm.result_group", ("streams", "segment"): "streams[].segment"}
# Set to something other than their default, on purpose: with no producer, a stream falls back to the
# trust of 0.1 (any member of group edgeinfer) and warns at every start; the file names the daemon's user.
# `models` has no default but the daemon needs one: the file names the package's bundle.
# `streams` defaults to none (a host may have pools only): the file shows one example camera.
EXAMPLES = {("streams", "producer"), ("models",), ("streams",)}
# A commented-out key: '#', one space, then `key:` where the key would stand.
# A list item of a commented-out example ("# - key:") counts too.
COMMENTED_KEY = re.compile(r"^(\s*)# ((?:- )?[a-z_][a-z0-9_]*:(?: |$))", re.M)


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (X, list[X], X | None, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def schema_fields(model: type[BaseModel] = config.Config, path: tuple = ()) -> dict:
    """Every key path of the schema → its pydantic field, walked recursively through the models."""
    out = {}
    for name, field in model.model_fields.items():
        out[(*path, name)] = field
        for sub in dict.fromkeys(_models_in(field.annotation)):
            out.update(schema_fields(sub, (*path, name)))
    return out


def file_keys(data, schema: dict, path: tuple = (), entry: bool = False) -> set[tuple]:
    """Every key path in parsed YAML (list items share their list's path). Descends only into keys the
    schema says hold a model, so a free-form mapping value would not read as keys."""
    out = set()
    if isinstance(data, list):
        for item in data:
            out |= file_keys(item, schema, path)
    elif isinstance(data, dict):
        by_name = not entry and path in schema and any(  # dict[...], or dict[...] | None
            typing.get_origin(a) is dict for a in (schema[path].annotation, *typing.get_args(schema[path].annotation)))
        for k, v in data.items():
            if by_name:  # a mapping of entries by name (models:): each entry's keys under the map's path
                out |= file_keys(v, schema, path, entry=True)
                continue
            key = (*path, k)
            out.add(key)
            if any(len(s) > len(key) and s[:len(key)] == key for s in schema):
                out |= file_keys(v, schema, key)
    return out


def uncommented(text: str) -> str:
    """The file with its commented-out keys put back: the key where its `#` stood, so YAML nests it there."""
    return COMMENTED_KEY.sub(r"\1\2", text)


def shown_keys(path, schema: dict) -> tuple[list[str], set[tuple]]:
    """(keys the file shows that the schema lacks, commented-out or not; every schema key the file shows)."""
    present = file_keys(yaml.safe_load(uncommented(path.read_text())), schema)
    return sorted(".".join(k) for k in present - set(schema)), present


def commented_out(path, schema: dict) -> set[tuple]:
    """The schema keys the file shows only in comments."""
    text = path.read_text()
    return file_keys(yaml.safe_load(uncommented(text)), schema) - file_keys(yaml.safe_load(text), schema)


def commented_with_a_default(path, schema: dict, examples=frozenset()) -> tuple[list[str], set[tuple]]:
    """(commented-out keys that have a default to show, other than `examples`; every commented-out key). Keys
    inside a commented-out key are part of its example (lanes: - cpus: ...)."""
    commented = commented_out(path, schema)
    wrong = sorted(".".join(k) for k in commented - set(examples)
                   if (schema[k].is_required() or schema[k].default is not None) and k[:-1] not in commented)
    return wrong, commented


def test_the_walk_sees_nested_keys():
    keys = schema_fields()
    for k in [("model", "trust_dir"), ("streams", "producer", "user"), ("streams", "readers", "groups"),
              ("ingress", "max_ring_mib"), ("runtime", "geometry_cooldown_s"), ("metrics", "health_deadline_s")]:
        assert k in keys
    assert set(ABI1_KEYS) | EXAMPLES <= set(keys)  # the exceptions name keys that exist
    assert ("streams", "producer", "uids") not in keys  # shm.allowed_uids' producers are no key of their own
    text = "a:\n  # b: 1         # why\n  # Prose: not a key\n  # see x: no\n  c: 2\n"
    assert yaml.safe_load(uncommented(text)) == {"a": {"b": 1, "c": 2}}


def test_shipped_config_has_every_key_of_the_schema_and_no_other():
    schema = schema_fields()
    text = SHIPPED.read_text()
    unknown, present = shown_keys(SHIPPED, schema)
    assert unknown == [], f"{SHIPPED} shows keys the schema does not have (commented-out or not): {unknown}"
    missing = sorted(".".join(k) for k in set(schema) - present - set(ABI1_KEYS))
    assert missing == [], f"{SHIPPED} does not document {missing}"
    for key, dotted in ABI1_KEYS.items():  # only in the one comment that says they are accepted with a warning
        assert key not in present, f"{dotted} (ABI 1) is documented as a key"
        assert dotted in text, f"the upgrade comment does not name {dotted}"
    assert "signing lands" not in text and "/dev/shm" not in text


def test_commented_out_keys_are_the_ones_without_a_default():
    """A key with a default is set, showing it; only a key that is unset by default is commented out."""
    wrong, commented = commented_with_a_default(SHIPPED, schema_fields())
    assert commented, "the walk found no commented-out key (the file has some)"
    assert wrong == [], f"commented out in {SHIPPED}, but they have a default to show: {wrong}"


@pytest.fixture
def edgeinfer_group(monkeypatch):
    """The shipped file names user and group edgeinfer, which the package creates
    (packaging/debian/edgeinfer.sysusers). Where this host has none, the loader is shown them (a stand-in for
    the package's sysusers step, in this process only)."""
    try:
        grp.getgrnam("edgeinfer")
    except KeyError:
        real_gr = grp.getgrnam
        monkeypatch.setattr(grp, "getgrnam", lambda name: grp.struct_group(("edgeinfer", "x", 64999, []))
                            if name == "edgeinfer" else real_gr(name))
    stand_in_user(monkeypatch, "edgeinfer", 64999, "/var/lib/edgeinfer")


def stand_in_user(monkeypatch, user: str, uid: int, home: str) -> None:
    """A system user the package creates (packaging/debian/*.sysusers), shown to the loader where this host has
    none: pwd.getpwnam answers for it, in this process only (uid and gid `uid`, shell nologin)."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        real = pwd.getpwnam
        monkeypatch.setattr(pwd, "getpwnam", lambda name: pwd.struct_passwd(
            (user, "x", uid, uid, "", home, "/usr/sbin/nologin")) if name == user else real(name))


def not_defaults(m: BaseModel, path: tuple = (), defaults: BaseModel | None = None,
                 examples: set[tuple] = EXAMPLES) -> list[str]:
    """Keys of a loaded config whose value is not the schema's default (`defaults`: the default of the
    model `m` stands for; `examples`: keys set to something else on purpose). A required key has no
    default: its own value stands, and the models in it are checked field by field."""
    out = []
    for name, field in type(m).model_fields.items():
        key, v = (*path, name), getattr(m, name)
        if key in examples:
            continue
        if defaults is not None:
            d = getattr(defaults, name)
        elif not field.is_required():
            d = field.get_default(call_default_factory=True)
        else:
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, BaseModel):
                    out += not_defaults(item, key, examples=examples)
            continue
        if isinstance(v, BaseModel) and type(v) is type(d):
            out += not_defaults(v, key, d, examples)  # name the key itself, not its section
        elif v != d:
            out.append(f"{'.'.join(key)}: {v!r}, default {d!r}")
    return out


def test_shipped_config_is_valid_and_shows_the_defaults(edgeinfer_group):
    """It loads without a warning, and every value it sets is the default (it documents defaults; an
    operator changes them)."""
    cfg = load_config(str(SHIPPED))
    assert cfg.warnings == []
    assert (wrong := not_defaults(cfg)) == [], f"{SHIPPED} sets values other than the defaults: {wrong}"
    assert cfg.streams[0].producer == Identity(user="edgeinfer")  # the one example, see EXAMPLES


def test_shipped_config_names_no_group_producer(edgeinfer_group):
    """The issue: the shipped `producer: {group: edgeinfer}` let any group member take the stream before its
    camera, with no warning. Every stream of the shipped file names a producer user, trusts no group, and
    the file loads without a warning."""
    cfg = load_config(str(SHIPPED))
    assert cfg.warnings == []
    for s in cfg.streams:
        assert s.producer is not None and s.producer.user is not None and s.producer.group is None, s
        assert not s.producer.trust_any_member
    assert not re.search(r"^\s*group:", SHIPPED.read_text().split("producer:", 1)[1].split("readers:", 1)[0], re.M)


def test_the_pixel_format_comment_names_every_format():
    """Issue 35: the comment omitted i420 and nv12. Every format a camera may write, and every colorimetry suffix,
    is named where pixel_format is shown."""
    from edgeinfer.abi.ringdefs import COLORIMETRIES, PIXEL_FORMATS
    text = SHIPPED.read_text()
    at = text.index("    pixel_format: ")
    comment = text[at:text.index("# width:", at)]
    for name in PIXEL_FORMATS:
        assert re.search(rf"\b{name}\b", comment), name
    for colour in COLORIMETRIES:
        if colour != "bt601":  # the default: said as "BT.601 limited range"
            assert f":{colour}" in comment, colour
