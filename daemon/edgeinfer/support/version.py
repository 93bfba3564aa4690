"""The version of edgeinfer, defined here once: setup.py reads this file, and every surface that shows a version
(`--version`, the gateway's ServerMetadata, /healthz, the package's face `edgeinfer.__version__`) imports it.
tests/unit/test_version.py holds the Debian changelog, the man pages and CHANGELOG.md to it."""

__all__ = ["VERSION"]

VERSION = "0.3.0"
