"""The upgrade operators run, in a booted Debian 12 container: 0.2.0 installed from the project's signed apt
repository over HTTP (`apt install edgeinfer`, after adding the repository as docs/operations/install-and-upgrade.md
says), serving two camera units, the gateway and the MQTT bridge with a reader and a tritonclient client attached;
then this release published into the same repository and `apt update && apt upgrade`; then `apt install
edgeinfer=0.2.0` back. The checks run inside (tests/system/upgrade.sh); this file builds the two states of the
repository (scripts/make-repo: 0.2.0 alone, then 0.2.0 and this release, one key), boots the container, and
asserts each check's line. 0.2.0's package is built once from its commit into the cache (tests/system/prepare)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import ROOT, built_deb, require_tool
from daemon_helpers import sign_copy
from edgeinfer import __version__
from test_repo import make_repo
from test_system_nspawn import NetworkNamespace, boot_container, free_ports, mount_root, prepared, run_at_boot

pytestmark = pytest.mark.timeout(2400)

CHECKS = ["repository_added", "install_0_2_0", "serving_0_2_0", "upgrade_0_2_0_to_this", "cameras_never_reconnect",
          "clients_bounded_gap", "conffiles_kept", "state_carried_over", "downgrade_to_0_2_0"]


@pytest.fixture(scope="module")
def upgrade_run(tmp_path_factory, signing_key):
    if os.geteuid() != 0:
        pytest.skip("system tests boot a container: they need root")
    nspawn = require_tool("systemd-nspawn")
    for tool in ("apt-ftparchive", "gpg"):
        require_tool(tool)
    built = prepared()
    if not built.get("release_0_2"):
        pytest.fail("0.2.0's package could not be built (tests/system/prepare: its commit is not in this clone)")
    work = tmp_path_factory.mktemp("upgrade")
    test, out = work / "test", work / "out"
    for d in (test, out):
        d.mkdir()
    # The repository as published with 0.2.0, then this release added to it as the docs say (make repo into the
    # same repository: the same key, signed again); the container serves one, then the other.
    key_dir = work / "repo-key"
    old = work / "edgeinfer_0.2.0_amd64.deb"
    shutil.copy(built["release_0_2"], old)
    r = make_repo(test / "repo-0.2.0", key_dir, old, url="http://127.0.0.1:PORT")
    assert r.returncode == 0, r.stderr
    shutil.copytree(test / "repo-0.2.0", test / "repo-0.3.0")
    r = make_repo(test / "repo-0.3.0", key_dir, built_deb(), built_deb("edgeinfer-rtsp"), url="http://127.0.0.1:PORT")
    assert r.returncode == 0 and "3 package(s)" in r.stderr, r.stderr
    repo_port, mqtt_port = free_ports(2)
    for name in ("repo-0.2.0", "repo-0.3.0"):
        sources = test / name / "edgeinfer.sources"
        sources.write_text(sources.read_text().replace("http://127.0.0.1:PORT", f"http://127.0.0.1:{repo_port}"))
    (test / "ports").write_text(f"{repo_port} {mqtt_port}\n")
    (test / "version").write_text(__version__)
    for f in ("upgrade.sh", "checks.sh", "gap.py", "gwgap.py"):
        shutil.copy(ROOT / "tests/system" / f, test / f)
    key, pub, _ = signing_key
    (test / "trust").mkdir()
    shutil.copy(pub, test / "trust" / "release.pub")
    sign_copy("orientation", test / "v1", key)
    root, mounted = mount_root(built["rootfs"], work)
    try:
        run_at_boot(root, "edgeinfer-upgradetest", "upgrade.sh", 1200)  # it starts Mosquitto on a free port
        netns = NetworkNamespace()  # its own loopback: the repository is served inside, on it
        try:
            boot = boot_container(nspawn, root, test, out, 1500, netns.path)
        finally:
            netns.close()
    finally:
        for m in mounted:
            subprocess.run(["umount", str(m)], timeout=120)
        for d in (root, work / "upper", work / "overlay-work"):
            shutil.rmtree(d, ignore_errors=True)
    results = (out / "results.txt").read_text() if (out / "results.txt").exists() else ""
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build/upgrade-results.txt").write_text(results)  # every check's figures, kept after the run
    journal = (out / "journal.txt").read_text() if (out / "journal.txt").exists() else ""
    return results, journal, boot


def test_the_upgrade_ran_every_check(upgrade_run):
    results, journal, boot = upgrade_run
    lines = results.splitlines()
    assert lines and lines[-1] == "DONE", f"the container stopped early: {results[-2000:]}\n{boot.stdout[-2000:]}"


@pytest.mark.parametrize("check", CHECKS)
def test_upgrade_check(upgrade_run, check):
    results, journal, _ = upgrade_run
    line = next((ln for ln in results.splitlines() if ln.split(" ", 2)[1:2] == [check]), None)
    assert line is not None, f"{check} did not run: {results[-1500:]}"
    assert line.startswith("PASS "), f"{line}\n--- journal (tail) ---\n{journal[-3000:]}"
