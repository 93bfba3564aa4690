"""One version, defined once (daemon/edgeinfer/__init__.py): every place that shows one is held to it here."""
from __future__ import annotations

import re
import subprocess
import sys

from edgeinfer import __version__

from conftest import ROOT


def test_the_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_setup_py_reads_the_package_version_and_states_none_of_its_own():
    text = (ROOT / "setup.py").read_text()
    assert "version=VERSION" in text and not re.search(r'version="\d', text)
    from importlib.metadata import version
    assert version("edgeinfer") == __version__, "the installed metadata (pip install -e .) is stale: make native"


def test_the_debian_changelog_top_entry_is_this_version_with_a_real_entry():
    text = (ROOT / "packaging/debian/changelog").read_text()
    first = text.splitlines()[0]
    assert first.startswith(f"edgeinfer ({__version__}) "), first
    entry = text.split("\n -- ", 1)[0]
    assert entry.count("  * ") >= 3, "the Debian changelog entry says what changed for an operator"


def test_both_man_pages_name_this_version_and_document_the_flag():
    for page in ("packaging/man/edgeinferd.8", "packaging/man/edgeinferctl.1"):
        text = (ROOT / page).read_text()
        assert f'"edgeinfer {__version__}"' in text.splitlines()[0], page
        assert "\\-\\-version" in text, f"{page} does not document --version"


def test_changelog_md_has_a_section_for_this_release_with_upgrade_steps():
    text = (ROOT / "CHANGELOG.md").read_text()
    major_minor = __version__.rsplit(".", 1)[0]
    head = re.search(rf"^## {re.escape(major_minor)} \({re.escape(__version__)}, \d{{4}}-\d\d-\d\d\)$", text, re.M)
    assert head, f"CHANGELOG.md has no '## {major_minor} ({__version__}, DATE)' section"
    section = text[head.end():].split("\n## ", 1)[0]
    assert "### Upgrading" in section, "the release section tells an operator what to do when upgrading"


def test_both_commands_print_the_version():
    for tool in ("edgeinferd", "edgeinferctl"):
        out = subprocess.run([sys.executable, "-c", f"import sys; from edgeinfer.cli.main import {tool}_main as m; "
                              "sys.exit(m(['--version']))"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"{tool} {__version__}", (tool, out)


def test_the_gateway_is_started_with_the_package_version():
    """The gateway's ServerMetadata answers the version its command passes (tests/integration/test_gateway.py
    asks tritonclient for it; /healthz's body is read in tests/integration/test_state_files.py)."""
    gw = (ROOT / "daemon/edgeinfer/cli/commands/gateway.py").read_text()
    assert "run(args.config, VERSION)" in gw and "importlib.metadata" not in gw
