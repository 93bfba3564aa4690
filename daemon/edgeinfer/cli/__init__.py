"""The command lines: edgeinferd and edgeinferctl. Rank 5. Its modules, one job each: docs/architecture.md, "Module map".
`python -m edgeinfer.cli` is edgeinferctl; the two entry points are importable from here."""
from edgeinfer.cli.main import edgeinferctl_main, edgeinferd_main  # noqa: F401
