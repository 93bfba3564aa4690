"""One definition of each thing (issue 36): the strict pydantic base is support/strictmodel.StrictModel and no
other module restates it. Read with `ast`, so nothing is imported."""
from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "daemon" / "edgeinfer"
BASE = PACKAGE / "support" / "strictmodel.py"


def _classes():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                yield path, node


def _extra(node: ast.ClassDef) -> str | None:
    """The `extra=` a class's own model_config gives, or None."""
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "model_config" for t in stmt.targets):
            for kw in getattr(stmt.value, "keywords", []):
                if kw.arg == "extra" and isinstance(kw.value, ast.Constant):
                    return kw.value.value
    return None


def test_strict_models_have_one_base():
    """A class straight on pydantic's BaseModel is the base itself, or a reader that ignores keys on purpose
    (cli's MetricsOnly, ModelOnly: one section of the daemon's file); nothing else writes extra="forbid"."""
    wrong = []
    for path, node in _classes():
        on_base_model = any(getattr(b, "id", getattr(b, "attr", "")) == "BaseModel" for b in node.bases)
        extra = _extra(node)
        where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
        if (path, node.name) == (BASE, "StrictModel"):
            assert on_base_model and extra == "forbid", where
        elif extra == "forbid" or (on_base_model and extra != "ignore"):
            wrong.append(where)
    assert not wrong, f"a strict model of its own (use edgeinfer.support.strictmodel.StrictModel): {wrong}"


def test_the_base_refuses_unknown_keys_and_freezes():
    import pydantic
    from edgeinfer.config.schema import Config
    from edgeinfer.support.strictmodel import StrictModel
    assert issubclass(Config, StrictModel)

    class Sample(StrictModel):
        a: int = 1
    try:
        Sample(b=2)
    except pydantic.ValidationError as e:
        assert "Extra inputs are not permitted" in str(e)
    else:
        raise AssertionError("an unknown key was accepted")
    s = Sample()
    try:
        s.a = 2
    except pydantic.ValidationError:
        pass
    else:
        raise AssertionError("a validated model was changed")


HOMES = {"StrictModel": "support/strictmodel.py", "Liveness": "support/liveness.py"}


def test_shared_helpers_are_defined_in_their_one_home():
    """The gateway and the MQTT bridge once had a Liveness each (the bridge's holding the whole Bridge)."""
    found = {name: [] for name in HOMES}
    for path, node in _classes():
        if node.name in found:
            found[node.name].append(str(path.relative_to(PACKAGE)))
    assert found == {name: [home] for name, home in HOMES.items()}


def test_no_class_name_means_two_things_in_the_package():
    """A class name names one class in the whole package: bridges/ had two BridgeMetrics (the settings' `metrics:`
    section and the Prometheus collectors), and two folders each had a `Models`, an `Admission`, a `ServedModel`, a
    `StreamState` and an `Output`, each a different thing."""
    seen: dict[str, pathlib.Path] = {}
    twice = []
    for path, node in _classes():
        if node.col_offset:
            continue                              # nested (a class inside a function or class)
        if node.name in seen and seen[node.name] != path:
            twice.append(f"{node.name}: {seen[node.name].relative_to(PACKAGE)} and {path.relative_to(PACKAGE)}")
        seen.setdefault(node.name, path)
    assert not twice, twice


def test_comments_name_files_that_exist():
    """A `NAME.py` (or `package/NAME.py`) in the package's or the native core's comments and docstrings is a
    file of the tree: 0.2's lane.py, engine.py, config.py and laneproto.py outlived their moves there. A path
    under a folder that is not ours (`frigate/config/base.py`) is someone else's and not checked."""
    repo = PACKAGE.parents[1]
    ours = {p.name for p in PACKAGE.iterdir() if p.is_dir()} | {"daemon", "edgeinfer", "tests", "bench", "native"}
    names = {p.name for p in repo.rglob("*.py") if ".venv" not in p.parts}
    sources = [*PACKAGE.rglob("*.py"), *(repo / "native").rglob("*.h"), *(repo / "native").glob("*.p[yx]?")]
    stale = []
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"(?<![\w/.])([\w/]+)\.py\b", line):
                parts = m.group(1).split("/")
                if len(parts) > 1 and parts[0] not in ours:
                    continue
                found = parts[-1] + ".py" in names and (
                    len(parts) == 1 or any(str(p).endswith(m.group(0)) for p in repo.rglob(parts[-1] + ".py")))
                if not found:
                    stale.append(f"{path.relative_to(repo)}:{number}: {m.group(0)}")
    assert not stale, stale
