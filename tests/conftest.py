"""Shared fixtures: unique stream names, the C examples compiled once, real
unprivileged users, and child processes that never outlive a test."""
from __future__ import annotations

import dataclasses
import glob
import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest


def _others_reach(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can walk down to `path` (every directory on the
    way searchable by others)."""
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


# Set when the clone is bound elsewhere for the tests' other users (below): what their commands put in front of
# sys.path, so that they import the package from the bound clone, not through the editable install's own path.
USERS_PYTHONPATH: str | None = None


def _reachable_clone(real: Path) -> Path:
    """The clone as the tests' other users reach it. A clone in a 0700 directory (a home on Debian 12, root's, a
    `mktemp -d`, or the clone's own directory made by `mktemp -d`) is out of their reach: the tests that run the
    clone's code as another user would die with ModuleNotFoundError or EACCES. Then (as root) this pytest enters a
    mount namespace of its own, shared by every process it starts and gone when they end, makes a 0755 directory
    under /tmp and binds each entry of the clone in it (a bind shows its source's own mode, so the clone's directory
    itself is not bound: its entries are, and git makes those 0755). ROOT and sys.executable are taken from there,
    by root and users alike. Where the namespace cannot be made, this says why and the clone stays where it is:
    the tests that run code as other users then fail with that reason, the rest run."""
    global USERS_PYTHONPATH
    if os.geteuid() != 0 or _others_reach(real):
        return real
    import atexit
    import ctypes
    import threading
    import warnings
    clone_newns, ms_rec, ms_private, ms_bind, mnt_detach = 0x00020000, 0x4000, 0x40000, 0x1000, 2
    libc = ctypes.CDLL(None, use_errno=True)
    if threading.active_count() != 1:  # unshare moves the calling thread only
        warnings.warn(f"{real} is out of other users' reach and threads run already: not bound")
        return real
    if libc.unshare(clone_newns) != 0 or libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0:
        warnings.warn(f"{real} is out of other users' reach, and no mount namespace could be made to bind it "
                      f"elsewhere: {os.strerror(ctypes.get_errno())}")
        return real
    where = Path(tempfile.mkdtemp(prefix="edgeinfer-clone-", dir="/tmp"))
    os.chmod(where, 0o755)
    for entry in real.iterdir():
        target = where / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
            continue
        target.mkdir() if entry.is_dir() else target.touch()
        if libc.mount(str(entry).encode(), str(target).encode(), None, ms_bind | ms_rec, None) != 0:
            raise OSError(ctypes.get_errno(), f"cannot bind {entry} at {target}")

    def unbind():
        for target in where.iterdir():
            if not target.is_symlink():
                libc.umount2(str(target).encode(), mnt_detach)
        shutil.rmtree(where, ignore_errors=True)
    atexit.register(unbind)
    exe = Path(sys.executable)
    if exe.resolve().is_relative_to(real) or exe.is_relative_to(real):
        sys.executable = str(where / (exe.relative_to(real) if exe.is_relative_to(real) else
                                      exe.resolve().relative_to(real)))
    USERS_PYTHONPATH = str(where / "daemon")
    return where


ROOT = _reachable_clone(Path(__file__).resolve().parent.parent)
IN_CI = os.environ.get("CI") == "true"
TESTS = Path(__file__).resolve().parent  # the tests as pytest collected them (not the bound clone)

# The folders are the kinds (CONTRIBUTING.md): unit (no root, no daemon that needs it, no system package beyond
# the build set, no .deb: `make check`), integration (the real daemon, root, ffmpeg, Prometheus, spin, the
# fuzzers; tests/reliability is integration too) and system (the .deb, in a booted systemd container).
KINDS = {"unit": "unit", "integration": "integration", "reliability": "integration", "system": "system"}

# Test modules share helpers by module name across folders (`from test_rtsp import RtspServer`), as when they
# sat side by side: every folder is importable, whichever of them pytest collects first (or alone).
for _folder in dict.fromkeys(KINDS):
    if str(TESTS / _folder) not in sys.path:
        sys.path.append(str(TESTS / _folder))


def pytest_collection_modifyitems(config, items):
    """Each test gets its folder's kind as a marker: `pytest -m unit`, `-m "not system"`."""
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(TESTS)
        kind = KINDS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if kind:
            item.add_marker(getattr(pytest.mark, kind))


def require_tool(name: str) -> str:
    """Path of a tool the test needs. Skips (with the reason) where it is
    missing; in CI the Makefile installs it, so its absence is a failure."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (make test installs it: see APT_PACKAGES in the Makefile)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def built_deb(package: str = "edgeinfer") -> str:
    """The .deb under test: `make test` builds it into build/deb before pytest runs (`make deb`);
    EDGEINFER_DEB_DIR names another build of it (`make deb DEB_BUILD=...`). package: edgeinfer, or the second
    binary package of the same source, edgeinfer-rtsp (PyAV; decision record 0036)."""
    deb_dir = os.environ.get("EDGEINFER_DEB_DIR", str(ROOT / "build/deb"))
    debs = sorted(glob.glob(os.path.join(deb_dir, f"{package}_*.deb")))
    if not debs:
        pytest.fail(f"no {deb_dir}/{package}_*.deb: `make test` builds it first (`make deb`)")
    return debs[-1]


def require_root(why: str) -> None:
    """Skips (fails in CI, which runs as root) a test that needs root."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail(f"needs root: {why}")
        pytest.skip(f"needs root: {why}")


@pytest.fixture
def stream():
    """A fresh stream name (rings are memfds: nothing to clean up on disk)."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def sandbox():
    """A directory every test user can enter (0755; a fresh clone may sit in a 0700 temp dir): the C
    examples and the sockets of daemons that other users must reach live here. Removed at the end."""
    d = tempfile.mkdtemp(prefix="edgeinfer-test-", dir="/tmp")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class UserSet:
    """Real, unprivileged users for the isolation tests (created for this run, deleted after it)."""

    group: str          # the sockets' group: every user below but `outsider` is in it
    gid: int
    cam_a: str          # the producer of one stream
    cam_b: str          # the producer of another (an honest neighbour, or an attacker)
    reader: str         # allowed to read results
    outsider: str       # not in the group: reaches no socket
    uids: dict          # name → uid
    more: tuple = ()    # two more group members with no role (attackers besides cam_b and reader)

    def run_as(self, user: str) -> list[str]:
        """The command prefix that runs a program as `user` with its groups (setpriv); where the clone is bound for
        other users (_reachable_clone), the package comes from there."""
        env = ["env", f"PYTHONPATH={USERS_PYTHONPATH}"] if USERS_PYTHONPATH else []
        return ["setpriv", f"--reuid={self.uids[user]}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups",
                *env]


@pytest.fixture(scope="session")
def users():
    require_root("creating users and running processes as them")
    tag = uuid.uuid4().hex[:6]
    group = f"eit{tag}"
    names = {k: f"eit{tag}{k}" for k in ("a", "b", "r", "o", "c", "d")}
    created = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for k, name in names.items():
            extra = [] if k == "o" else ["-G", group]
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", *extra, name], check=True,
                           capture_output=True)
            created.append(name)
        yield UserSet(group, grp.getgrnam(group).gr_gid, names["a"], names["b"], names["r"], names["o"],
                        {n: pwd.getpwnam(n).pw_uid for n in names.values()}, (names["c"], names["d"]))
    finally:
        for name in created:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


class Children:
    """Child processes of one test; all killed and reaped at its end."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def spawn(self, args, **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen(args, **kw)
        self.procs.append(p)
        return p

    def python(self, code: str, *args, **kw) -> subprocess.Popen:
        return self.spawn([sys.executable, "-c", code, *map(str, args)], **kw)

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (p.stdout, p.stderr, p.stdin):
                if stream:
                    stream.close()


@pytest.fixture
def children():
    c = Children()
    yield c
    c.cleanup()


def compile_c(source: Path, sandbox: Path) -> str:
    """A C program of ours (ring.h only) compiled once into the sandbox, where every test user may run it."""
    cc = require_tool("cc")
    out = sandbox / source.stem
    if not out.exists():
        subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "native/include"),
                        str(source), "-o", str(out)], check=True)
        os.chmod(out, 0o755)
    return str(out)


@pytest.fixture(scope="session")
def c_producer(sandbox) -> str:
    """examples/producer.c compiled with the system C compiler, against ring.h only (any user may run it)."""
    return compile_c(ROOT / "examples/producer.c", sandbox)


@pytest.fixture(scope="session")
def c_reader(sandbox) -> str:
    """examples/reader.c, likewise."""
    return compile_c(ROOT / "examples/reader.c", sandbox)


def read_line(proc: subprocess.Popen, timeout: float = 10.0) -> str:
    """One line of a child's stdout, or fail after `timeout` seconds."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            pytest.fail(f"no output from {proc.args!r} within {timeout}s")
        line = proc.stdout.readline()
    finally:
        sel.close()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"{proc.args!r} exited ({proc.wait()}) without output: {err}")
    return line.strip()


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory):
    """A test EC key pair; its public key is the only one in the test trust store."""
    from edgeinfer.models.verify import generate_keys
    d = tmp_path_factory.mktemp("keys")
    key, pub = generate_keys(str(d), "test")
    trust = d / "trust"
    trust.mkdir()
    (trust / "test.pub").write_bytes(open(pub, "rb").read())
    return key, pub, str(trust)


@pytest.fixture(scope="session")
def bundles(tmp_path_factory, signing_key):
    """bundles(name): a signed copy of a fetched model bundle, trusted by the test trust store."""
    import daemon_helpers
    key, _, trust = signing_key
    daemon_helpers.TRUST_DIR = trust
    root = tmp_path_factory.mktemp("signed")
    made = {}

    def get(name: str) -> str:
        if name not in made:
            made[name] = daemon_helpers.sign_copy(name, root / name, key)
        return made[name]
    return get


# ------------------------------------------------------------ reliability matrix

_MATRIX = None


@pytest.fixture(scope="session")
def matrix():
    """The fault matrix rows of this run (tests/reliability_matrix.py)."""
    global _MATRIX
    from reliability_matrix import Matrix
    if _MATRIX is None:
        _MATRIX = Matrix()
    return _MATRIX


def pytest_terminal_summary(terminalreporter):
    if _MATRIX is None or not _MATRIX.rows:
        return
    from reliability_matrix import PROFILE
    _MATRIX.note_failures(terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", []))
    terminalreporter.section(f"reliability matrix ({PROFILE} profile)")
    for line in _MATRIX.table():
        terminalreporter.write_line(line)
    for name, why in _MATRIX.unrecorded:
        terminalreporter.write_line(f"FAILED BEFORE RECORDING ITS ROW: {name}: {why}")
    rows = os.environ.get("EDGEINFER_RELIABILITY_ROWS")
    if rows:  # make test: one of two processes (scripts/run-tests merges their rows into one report)
        _MATRIX.save_rows(rows)
    out = os.environ.get("EDGEINFER_RELIABILITY_REPORT")
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(_MATRIX.markdown())
        terminalreporter.write_line(f"written to {out}")
