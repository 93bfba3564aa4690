"""The signed apt repository that `make repo` builds (scripts/make-repo), checked as apt checks it: the real
`apt-get update` of this host, with its lists, cache and sources in a temporary directory (the host's own apt
state is not touched), against the repository served over HTTP on 127.0.0.1. What an operator sees when the
repository's metadata expired or its signature is wrong is asserted in apt's own words, as
docs/operations/install-and-upgrade.md quotes them. The upgrade an operator runs from this repository, in a booted
container, is tests/system/test_upgrade_nspawn.py."""
from __future__ import annotations

import email.utils
import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
import time

import pytest

from conftest import ROOT, built_deb, require_tool
from edgeinfer import __version__

MAKE_REPO = str(ROOT / "scripts/make-repo")


def make_repo(out, key_dir, *debs, valid_days: int = 30, url: str = "http://127.0.0.1:1") -> subprocess.CompletedProcess:
    return subprocess.run([MAKE_REPO, "--out", str(out), "--key-dir", str(key_dir), "--url", url,
                           "--valid-days", str(valid_days), *map(str, debs)],
                          capture_output=True, text=True, timeout=300)


def deb822(text: str) -> dict[str, str]:
    return dict(ln.split(": ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))


class Served:
    """A static HTTP server of a directory on 127.0.0.1 (what any web server does for this repository)."""

    def __init__(self, root):
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        handler.log_message = lambda *a: None
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class IsolatedApt:
    """apt-get and apt-cache with every state directory of their own: the repository's .sources file, its key where
    the file's Signed-By names it (rewritten to the temporary path), lists and cache in tmp."""

    def __init__(self, tmp, sources_text: str, keyring):
        self.dir = tmp
        parts = tmp / "sources.list.d"
        parts.mkdir()
        key = tmp / "edgeinfer.pgp"
        shutil.copy(keyring, key)
        (parts / "edgeinfer.sources").write_text(sources_text.replace("/etc/apt/keyrings/edgeinfer.pgp", str(key)))
        for d in ("lists/partial", "cache/archives/partial"):
            (tmp / d).mkdir(parents=True)
        self.opts = ["-o", f"Dir::Etc::SourceList={os.devnull}", "-o", f"Dir::Etc::SourceParts={parts}",
                     "-o", f"Dir::State::Lists={tmp / 'lists'}", "-o", f"Dir::Cache={tmp / 'cache'}",
                     "-o", "Dir::Etc::Trusted=/nonexistent", "-o", f"Dir::Etc::TrustedParts={tmp / 'no-trusted'}",
                     "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
                     # Debian's defaults, which a host's own apt.conf.d may turn off (this one's mirror settings do:
                     # Acquire::Check-Valid-Until "false"): what an operator's stock apt checks.
                     "-o", "Acquire::Check-Valid-Until=true", "-o", "Acquire::Check-Date=true"]

    def update(self, *prefix: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, "apt-get", "update", *self.opts], capture_output=True, text=True, timeout=120)

    def versions(self) -> list[str]:
        r = subprocess.run(["apt-cache", *self.opts, "madison", "edgeinfer"], capture_output=True, text=True,
                           timeout=60)
        return [ln.split("|")[1].strip() for ln in r.stdout.splitlines() if "|" in ln]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    for tool in ("apt-ftparchive", "gpg", "gpgv", "sqv"):
        require_tool(tool)
    work = tmp_path_factory.mktemp("repo")
    r = make_repo(work / "repo", work / "key", built_deb())
    assert r.returncode == 0, r.stderr
    return work / "repo", work / "key", r


def test_make_repo_signs_a_static_repository_with_a_key_of_its_own(repo):
    root, key_dir, r = repo
    dist = root / "dists/bookworm"
    for f in ("InRelease", "Release", "Release.gpg", "main/binary-amd64/Packages", "main/binary-amd64/Packages.gz"):
        assert (dist / f).is_file(), f
    assert (root / f"pool/main/e/edgeinfer/edgeinfer_{__version__}_amd64.deb").is_file()
    assert "making the repository's signing key" in r.stderr, r.stderr
    assert (key_dir.stat().st_mode & 0o777) == 0o700, oct(key_dir.stat().st_mode)
    assert not str(key_dir).startswith(str(ROOT)), "the key is made outside the clone"
    release = deb822((dist / "Release").read_text().split("\nMD5Sum:")[0])
    assert (release["Origin"], release["Suite"], release["Components"], release["Architectures"]) == \
        ("edgeinfer", "bookworm", "main", "amd64"), release
    valid = email.utils.parsedate_to_datetime(release["Valid-Until"]).timestamp() - \
        email.utils.parsedate_to_datetime(release["Date"]).timestamp()
    assert valid == 30 * 86400, release
    assert "SHA256:" in (dist / "Release").read_text() and "SHA512:" in (dist / "Release").read_text()
    # Both verifiers apt uses (gpgv in Debian 12, sqv from Debian 13) accept the signatures with the shipped key.
    keyring = root / "edgeinfer-archive-keyring.pgp"
    for cmd in (["gpgv", "--keyring", str(keyring), str(dist / "InRelease")],
                ["gpgv", "--keyring", str(keyring), str(dist / "Release.gpg"), str(dist / "Release")],
                ["sqv", "--keyring", str(keyring), str(dist / "Release.gpg"), str(dist / "Release")]):
        v = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert v.returncode == 0, (cmd, v.stderr)
    # No key is ever made inside the clone, nor committed.
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True).stdout
    assert not re.search(r"(secring|private-keys-v1\.d|pubring\.kbx|trustdb\.gpg)", tracked)


def test_the_sources_file_is_deb822_with_signed_by(repo):
    root, _, _ = repo
    s = deb822((root / "edgeinfer.sources").read_text())
    assert s == {"Types": "deb", "URIs": "http://127.0.0.1:1", "Suites": "bookworm", "Components": "main",
                 "Architectures": "amd64", "Signed-By": "/etc/apt/keyrings/edgeinfer.pgp"}, s


def test_a_key_dir_inside_the_clone_is_refused_however_it_is_named(tmp_path):
    for key_dir in (ROOT / "build" / "repo-key-here", "build/repo-key-here", ROOT / "build" / ".." / "repo-key-here"):
        r = subprocess.run([MAKE_REPO, "--out", str(tmp_path / "repo"), "--key-dir", str(key_dir), built_deb()],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "inside the clone" in r.stderr, (key_dir, r.stderr)
    assert not (ROOT / "build" / "repo-key-here").exists() and not (ROOT / "repo-key-here").exists()


def test_signing_again_without_a_package_renews_valid_until_and_lists_only_the_index(repo):
    """What `make repo-sign` runs before Valid-Until passes: the same packages, a new date; Release lists the
    index it signs, never a previous Release."""
    root, key_dir, _ = repo
    before = (root / "dists/bookworm/Release").read_text()
    time.sleep(1.1)  # Release's Date has a resolution of one second
    r = subprocess.run([MAKE_REPO, "--out", str(root), "--key-dir", str(key_dir)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    after = (root / "dists/bookworm/Release").read_text()
    assert deb822(after.split("\nMD5Sum:")[0])["Date"] != deb822(before.split("\nMD5Sum:")[0])["Date"]
    assert deb822((root / "edgeinfer.sources").read_text())["URIs"] == "http://127.0.0.1:1", "the URL is kept"
    listed = {ln.split()[-1] for ln in after.splitlines() if ln.startswith(" ")}
    assert listed == {"main/binary-amd64/Packages", "main/binary-amd64/Packages.gz"}, listed
    v = subprocess.run(["gpgv", "--keyring", str(root / "edgeinfer-archive-keyring.pgp"),
                        str(root / "dists/bookworm/InRelease")], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stderr


def test_a_repository_signed_by_another_key_is_never_signed_again_by_a_new_one(repo, tmp_path):
    """A lost key directory (another machine, another HOME) must not turn into a new key silently: every host
    trusts the old one and would refuse every update (NO_PUBKEY)."""
    root, _, _ = repo
    before = (root / "dists/bookworm/InRelease").read_bytes()
    r = subprocess.run([MAKE_REPO, "--out", str(root), "--key-dir", str(tmp_path / "elsewhere")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "hosts trust that key only" in r.stderr, r.stderr
    assert (root / "dists/bookworm/InRelease").read_bytes() == before and not (tmp_path / "elsewhere").exists()


def test_a_published_version_never_changes(repo, tmp_path):
    root, key_dir, _ = repo
    other = tmp_path / "other.deb"
    shutil.copy(built_deb(), other)
    with open(other, "ab") as f:  # same name and version, other bytes
        f.write(b"\n")
    r = make_repo(root, key_dir, other)
    assert r.returncode == 1 and "already published with other contents" in r.stderr, r.stderr


def test_apt_updates_from_it_over_http_and_sees_the_version(repo, tmp_path):
    root, _, _ = repo
    served = Served(root)
    try:
        sources = (root / "edgeinfer.sources").read_text().replace("http://127.0.0.1:1", served.url)
        apt = IsolatedApt(tmp_path, sources, root / "edgeinfer-archive-keyring.pgp")
        r = apt.update()
        assert r.returncode == 0 and "W:" not in r.stdout + r.stderr, r.stdout + r.stderr
        assert apt.versions() == [__version__]
    finally:
        served.close()


def test_apt_refuses_an_expired_repository_in_the_words_the_docs_quote(repo, tmp_path):
    """Valid-Until passed (a repository made with --valid-days 1, apt run two days later under faketime): apt
    keeps nothing of it."""
    require_tool("faketime")
    root, key_dir, _ = repo
    short = tmp_path / "short"
    assert make_repo(short, key_dir, built_deb(), valid_days=1).returncode == 0
    served = Served(short)
    try:
        sources = (short / "edgeinfer.sources").read_text().replace("http://127.0.0.1:1", served.url)
        (tmp_path / "apt").mkdir()
        apt = IsolatedApt(tmp_path / "apt", sources, short / "edgeinfer-archive-keyring.pgp")
        r = apt.update("faketime", "-f", "+2d")
        said = r.stdout + r.stderr
        assert r.returncode != 0 and re.search(r"Release file for \S+ is expired \(invalid since", said), said
        assert "Updates for this repository will not be applied" in said, said
        assert apt.versions() == []
        docs = " ".join((ROOT / "docs/operations/install-and-upgrade.md").read_text().split())
        assert "is expired (invalid since" in docs and "Updates for this repository will not be applied" in docs
    finally:
        served.close()


def test_apt_refuses_a_repository_signed_by_another_key(repo, tmp_path):
    """A Release re-signed by a key that is not the one Signed-By names (a compromised mirror): refused, and
    nothing of it is used."""
    root, _, _ = repo
    forged = tmp_path / "forged"
    shutil.copytree(root, forged)
    for f in ("dists/bookworm/InRelease", "dists/bookworm/Release.gpg", "edgeinfer-archive-keyring.pgp"):
        (forged / f).unlink()
    (forged / "pool").rename(tmp_path / "pool-aside")
    r = make_repo(forged, tmp_path / "other-key", built_deb())  # the same packages, signed by another key
    assert r.returncode == 0, r.stderr
    served = Served(forged)
    try:
        sources = (root / "edgeinfer.sources").read_text().replace("http://127.0.0.1:1", served.url)
        (tmp_path / "apt").mkdir()
        apt = IsolatedApt(tmp_path / "apt", sources, root / "edgeinfer-archive-keyring.pgp")
        r = apt.update()
        said = r.stdout + r.stderr
        assert r.returncode != 0 and "NO_PUBKEY" in said and "is not signed" in said, said
        assert apt.versions() == [], "apt used a repository whose signature it could not verify"
        docs = " ".join((ROOT / "docs/operations/install-and-upgrade.md").read_text().split())
        assert "NO_PUBKEY" in docs and "is not signed" in docs
    finally:
        served.close()
