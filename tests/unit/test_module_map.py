"""docs/architecture.md's module map is the one map of the package: it names every module of
daemon/edgeinfer (each package's __init__.py aside: those point to the map) and none that is not there, each
once, so that it stays true through moves and renames. CONTRIBUTING.md and the packages' docstrings point
to it instead of listing modules of their own."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "daemon" / "edgeinfer"
ROW = re.compile(r"^\|[^|]*\|\s*`([^`]+\.py)`\s*\|")


def _map_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for line in section.splitlines() if (m := ROW.match(line))]


def _modules() -> set[str]:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def test_the_map_names_every_module_once_and_no_other():
    rows = _map_rows()
    assert len(rows) == len(set(rows)), sorted({r for r in rows if rows.count(r) > 1})
    missing = _modules() - set(rows)
    gone = set(rows) - _modules()
    assert not missing, f"modules the map in docs/architecture.md does not name: {sorted(missing)}"
    assert not gone, f"the map in docs/architecture.md names modules that are not there: {sorted(gone)}"


def test_the_packages_and_contributing_point_to_the_map():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "docs/architecture.md" in doc, f"{init.relative_to(ROOT)}: its docstring does not point to the map"
    assert "docs/architecture.md" in (ROOT / "CONTRIBUTING.md").read_text()
