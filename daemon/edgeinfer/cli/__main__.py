"""`python -m edgeinfer.cli ARGS`: edgeinferctl ARGS."""
import sys

from edgeinfer.cli.main import edgeinferctl_main

sys.exit(edgeinferctl_main())
