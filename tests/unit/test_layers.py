"""The package's layering (CONTRIBUTING.md, shared/ARCHITECTURE.md §6): every import under daemon/edgeinfer,
at module level or inside a function, runs down the layers, never up, and no two modules import each other,
directly or round a loop. Read with `ast`, so nothing is imported.

Ranks, bottom to top (a package imports its own modules and those of lower ranks only; packages of the same
rank do not import each other):
  0  abi, support      the native core's only importers (abi), and leaf helpers (support)
  1  models            bundles, checks, signing, runtime, fusion, decoders, tools
  2  config            the schema names models (bundles and their size limits), never the reverse
  3  lanes, telemetry, cameras   the lanes never import control; telemetry sits below control
  4  control, fronts, bridges   the daemon's wiring and serve loop; the network gateway and the MQTT bridge
                       (processes of their own)
  5  cli               edgeinferd, edgeinferctl, status views, the demo
The native modules edgeinfer._ring and edgeinfer._hist are imported by abi only, edgeinfer._harden (the lanes'
sandbox) by support only, edgeinfer._decode (a decoder's per-frame arithmetic) by models only. The compatibility names at
the top (edgeinfer.ring, edgeinfer.payloads, edgeinfer.producers) are for clients: no module of the package
imports them."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "daemon"  # tests/unit/ -> the repository

RANKS = {"abi": 0, "support": 0, "models": 1, "config": 2, "lanes": 3, "telemetry": 3, "cameras": 3,
         "control": 4, "fronts": 4, "bridges": 4, "cli": 5}
NATIVE = {"edgeinfer._ring": "abi", "edgeinfer._hist": "abi", "edgeinfer._harden": "support",
          "edgeinfer._decode": "models"}  # module → its importer
COMPAT = ("edgeinfer.ring", "edgeinfer.payloads", "edgeinfer.producers")


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in sorted((ROOT / "edgeinfer").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every edgeinfer module `name` imports: `from a import b` is a.b where that is a
    module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "edgeinfer"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "edgeinfer":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((node.lineno, sub if sub in MODULES or sub in NATIVE else base))
    return sorted(set(found))


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else None


def _graph() -> dict[str, set[str]]:
    return {name: {m for _, m in _imports(name, path) if m in MODULES and m != name}
            for name, path in MODULES.items()}


def test_every_module_is_in_a_layer():
    top = {"edgeinfer", *NATIVE, *COMPAT} | {m for m in MODULES if m.startswith("edgeinfer.producers.")}
    assert [m for m in MODULES if _layer(m) is None and m not in top] == []
    assert set(RANKS) == {p.name for p in (ROOT / "edgeinfer").iterdir() if (p / "__init__.py").exists()} - \
        {"producers"}


def test_imports_run_down_the_layers():
    wrong = []
    for name, path in MODULES.items():
        here = _layer(name)
        for line, target in _imports(name, path):
            where = f"{path.relative_to(ROOT)}:{line}: {name} imports {target}"
            if target in NATIVE:
                if here != NATIVE[target]:
                    wrong.append(where + f" (only {NATIVE[target]}/ imports {target})")
                continue
            if target == "edgeinfer" or target.startswith(COMPAT):
                if here is not None:
                    wrong.append(where + " (a compatibility name, for clients only)")
                continue
            there = _layer(target)
            if here is None or there is None or there == here:
                continue
            if RANKS[there] >= RANKS[here]:
                wrong.append(where + f" ({there}, rank {RANKS[there]}, is not below {here}, rank {RANKS[here]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = _graph()
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_what_it_checks():
    """A sample of known edges, so that a parser that found nothing would not pass."""
    graph = _graph()
    assert "edgeinfer.abi.vocabulary" in graph["edgeinfer.abi.ring"]
    assert "edgeinfer.lanes.process" in graph["edgeinfer.lanes.zygote"]
    assert "edgeinfer.control.daemon" in graph["edgeinfer.cli.main"]  # inside a function
    assert ("edgeinfer._ring" in {m for _, m in _imports("edgeinfer.abi.ring", MODULES["edgeinfer.abi.ring"])})


def test_no_collaborator_is_handed_the_daemon():
    """Collaborators get what they use (CONTRIBUTING.md): no function or constructor below the CLI takes the
    Daemon object (a parameter named `daemon`), and no object keeps one (`self.daemon`). The daemon hands each
    its parts: the lanes, the registry, the fd store, a snapshot function."""
    wrong = []
    for name, path in MODULES.items():
        if _layer(name) == "cli" or name == "edgeinfer.control.daemon":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}({a.arg})" for a in args
                          if a.arg == "daemon"]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == "daemon" \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: self.daemon = …")
    assert not wrong, "\n".join(wrong)
