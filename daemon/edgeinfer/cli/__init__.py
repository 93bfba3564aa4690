"""The command lines: edgeinferd (main.py) and edgeinferctl (ctl.py, commands/), status views, result
labels, the demo.
`python -m edgeinfer.cli` is edgeinferctl; the two entry points are importable from here."""
from edgeinfer.cli.main import edgeinferctl_main, edgeinferd_main  # noqa: F401
