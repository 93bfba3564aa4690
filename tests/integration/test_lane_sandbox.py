"""Lanes hardened without systemd: a lane (it parses camera bytes) runs as an unprivileged user, holds no
capability once its loop has its priority, has no_new_privs and a seccomp filter that allows what a lane does
(sandbox.py, native/harden.h). Checked on a live daemon's lanes through /proc, and by playing a compromised
lane: a forked process hardened the same way tries what an attacker would next."""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import require_root
from daemon_helpers import daemon_log, start_daemon, stop_daemon, write_config
from test_daemon import feed_and_collect

from edgeinfer.cameras.synthetic import make_frames
from edgeinfer.config.schema import ConfigError, load_config
from edgeinfer.support import sandbox

CAP_NONE = 0


def _status(path: str) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _lanes_of(daemon_pid: int) -> list[int]:
    """The pids of the lanes under `daemon_pid` (daemon → zygote → lanes)."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(p))
    lanes = []
    for zygote in children.get(daemon_pid, []):
        for pid in children.get(zygote, []):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().startswith("edgeinfer-lane"):
                        lanes.append(pid)
            except OSError:  # gone since /proc was listed (a lane being killed): not a lane any more
                continue
    return lanes


def _assert_hardened(pid: int, uid: int, gid: int, groups: str = "", bounding: bool = False) -> list[str]:
    """Every thread of lane `pid`: ids (and supplementary `groups`, as /proc says them), no capability (with
    `bounding`, none in the bounding set either: a root daemon's lane), no_new_privs, a seccomp filter. Returns
    its threads' names."""
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        st = _status(f"/proc/{pid}/task/{tid}/status")
        names.append(st["Name"])
        assert st["Uid"].split() == [str(uid)] * 4, (st["Name"], st["Uid"])
        assert st["Gid"].split() == [str(gid)] * 4, (st["Name"], st["Gid"])
        assert st["Groups"] == groups, (st["Name"], st["Groups"])
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb") + (("CapBnd",) if bounding else ()):
            assert int(st[cap], 16) == CAP_NONE, (st["Name"], cap, st[cap])
        assert st["NoNewPrivs"] == "1", st["Name"]
        assert st["Seccomp"] == "2", st["Name"]
    return names


@pytest.mark.parametrize("named", [False, True], ids=["default-user", "runtime.lane_user"])
def test_a_root_daemons_lanes_run_unprivileged_and_serve(named, users, bundles, children, tmp_path, stream):
    """edgeinferd started as root in the foreground: its lanes run as runtime.lane_user (or the package's user
    edgeinfer, else a dynamic uid of their own, said in the log), every thread without a capability, even in its
    bounding set, with no_new_privs and the seccomp filter; the loop still takes SCHED_FIFO and every frame is
    served."""
    require_root("a daemon started as root")
    dynamic = False
    if named:
        want = pwd.getpwnam(users.more[0])
    else:
        try:
            want = pwd.getpwnam(sandbox.DEFAULT_LANE_USER)
        except KeyError:
            dynamic = True
    runtime = {"lane_user": users.more[0]} if named else None
    cfg = write_config(tmp_path, bundles("orientation"),
                       [{"name": stream, "width": 224, "height": 224, "max_age_ms": 60000}], runtime=runtime)
    proc = start_daemon(children, cfg)
    frames = [f for f, _ in make_frames(224, 224, pages=2)]
    got = feed_and_collect(proc, stream, frames, 20)
    assert len(got) == 20
    lanes = _lanes_of(proc.pid)
    assert lanes, "no lane found under the daemon"
    if dynamic:
        uid = int(_status(f"/proc/{lanes[0]}/status")["Uid"].split()[0])
        assert uid in sandbox.DYNAMIC_UIDS, uid
        want = pwd.struct_passwd((f"dynamic uid {uid}", "x", uid, uid, "", "/", ""))
    for pid in lanes:
        names = _assert_hardened(pid, want.pw_uid, want.pw_gid, bounding=True)
        loop = [t for t in os.listdir(f"/proc/{pid}/task") if _status(f"/proc/{pid}/task/{t}/status")["Name"]
                .startswith("edgeinfer-rt")]
        assert len(loop) == 1, names
        assert os.sched_getscheduler(int(loop[0])) == os.SCHED_FIFO, "the loop lost its real-time priority"
    assert stop_daemon(proc) == 0
    log = daemon_log(proc)
    if dynamic:
        assert f"lanes run as dynamic uid {want.pw_uid}," in log, log[-2000:]
        assert (f"there is no user {sandbox.DEFAULT_LANE_USER}: its lanes run as dynamic uid {want.pw_uid}, which "
                f"no other process has") in log, log[-2000:]
    else:
        assert f"lanes run as user {want.pw_name}" in log, log[-2000:]


@pytest.fixture
def daemon_home(users, signing_key, bundles):
    """A directory the unprivileged daemon user (users.cam_a) owns, with a signed bundle it can read."""
    base = Path(tempfile.mkdtemp(prefix="ei-sbx-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        trust = base / "trust"
        trust.mkdir()
        shutil.copy(signing_key[1], trust / "test.pub")
        bundle = base / "bundle"
        shutil.copytree(bundles("orientation"), bundle)
        subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
        pw = pwd.getpwnam(users.cam_a)
        for d in (base / "state", base / "run"):
            d.mkdir(mode=0o750)
            os.chown(d, pw.pw_uid, pw.pw_gid)
        yield base, str(trust), str(bundle), pw
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_unprivileged_daemons_lanes_keep_its_user_and_drop_the_rest(daemon_home, users, children, stream):
    """edgeinferd started as an unprivileged user (no systemd): its lanes keep that user, with no capability,
    no_new_privs and the seccomp filter. Real time is refused (no right to it), said, and frames are served."""
    base, trust, bundle, pw = daemon_home
    cfg = write_config(base / "run", bundle, [{"name": stream, "width": 224, "height": 224, "max_age_ms": 60000}],
                       trust_dir=trust, state_dir=str(base / "state"))
    log_file = base / "run" / "daemon.log"
    try:
        proc = start_daemon(children, cfg, run_as=users.run_as(users.cam_a), log_file=str(log_file))
    except BaseException:
        print(log_file.read_text() if log_file.exists() else "no log")
        raise
    frames = [f for f, _ in make_frames(224, 224, pages=2)]
    assert len(feed_and_collect(proc, stream, frames, 10)) == 10
    lanes = _lanes_of(proc.pid)  # setpriv execs the daemon in place
    assert lanes
    groups = _status(f"/proc/{proc.pid}/status")["Groups"]  # a user cannot give up its groups: the daemon's
    for pid in lanes:
        _assert_hardened(pid, pw.pw_uid, pw.pw_gid, groups)
    assert stop_daemon(proc) == 0
    log = daemon_log(proc)
    assert f"lanes run as this process's user (uid {pw.pw_uid})" in log, log[-2000:]


# ------------------------------------------------------------------- a compromised lane

# What a hardened lane tries, as the child scripts below say it: out[name] is "allowed", or the errno's name.
_ATTEMPT = r"""
import errno
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
"""

_ATTEMPTS = _ATTEMPT + r"""
import ctypes, errno, fcntl, json, mmap, os, resource, signal, socket, struct, sys, termios, threading, tty
from edgeinfer.support import sandbox
libc = ctypes.CDLL(None, use_errno=True)
ident = sandbox.LaneIdentity(int(sys.argv[1]), int(sys.argv[2]), "lane")
target, nice_kept = sys.argv[3], sys.argv[4] == "kept"
TIOCSTI = 0x5412
out = {}
# Its stdin: a terminal that is its controlling one (a daemon started by hand in a shell), raw, so that FIONREAD
# counts what was typed into it. Before hardening, TIOCSTI types: the check below would see a typed byte.
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
tty.setraw(0)
fcntl.ioctl(0, TIOCSTI, b"r")
out["typed_before"] = struct.unpack("i", fcntl.ioctl(0, termios.FIONREAD, b"\0" * 4))[0]
os.read(0, 1)
# Another lane: a process of the same uid (the kernel would let one re-pin the other), its CPUs and policy known.
r, w = os.pipe()
victim = os.fork()
if victim == 0:
    os.setgroups([]); os.setresgid(ident.gid, ident.gid, ident.gid); os.setresuid(ident.uid, ident.uid, ident.uid)
    os.close(w); os.read(r, 1); os._exit(0)
os.close(r)
victim_cpus = os.sched_getaffinity(victim)
if nice_kept:  # root without CAP_SYS_RESOURCE (a container): RLIMIT_RTPRIO stays 0, CAP_SYS_NICE is kept a while
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    class Hdr(ctypes.Structure): _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure): _fields_ = [("eff", ctypes.c_uint32), ("prm", ctypes.c_uint32), ("inh", ctypes.c_uint32)]
    hdr, data = Hdr(0x20080522, 0), (Data * 2)()
    assert libc.syscall(125, ctypes.byref(hdr), data) == 0  # capget
    for d in data[:1]:
        d.eff &= ~(1 << 24); d.prm &= ~(1 << 24)  # CAP_SYS_RESOURCE
    assert libc.syscall(126, ctypes.byref(hdr), data) == 0  # capset
keeps = sandbox.harden_lane(ident, "fifo", 50)
out["kept_nice"] = keeps


def raw(rc):
    if rc == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

# What a lane does: must keep working.
def loop():
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    if keeps:
        sandbox.release_nice()
    out["loop_policy"] = os.sched_getscheduler(0)
t = threading.Thread(target=loop); t.start(); t.join()
if keeps:
    sandbox.release_nice()
attempt("read_cpuinfo", lambda: open("/proc/cpuinfo").read())
attempt("anonymous_memory", lambda: mmap.mmap(-1, 1 << 20))
# What an attacker in a lane would try next: each refused.
attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("execve", lambda: os.execv("/bin/sh", ["sh", "-c", "true"]))
attempt("fork", lambda: os.fork())
attempt("open_for_write", lambda: open(target, "w"))
attempt("create", lambda: os.open(target + ".new", os.O_CREAT | os.O_WRONLY, 0o644))
attempt("unlink", lambda: os.unlink(target))
attempt("memfd_create", lambda: os.memfd_create("x"))
attempt("kill_init", lambda: os.kill(1, 0))
attempt("ptrace_init", lambda: raw(libc.ptrace(16, 1, None, None)))
attempt("unshare_userns", lambda: raw(libc.unshare(0x10000000)))
attempt("setuid_root", lambda: os.setuid(0))
attempt("fifo_for_init", lambda: os.sched_setscheduler(1, os.SCHED_FIFO, os.sched_param(99)))
attempt("write_exec_memory", lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC))
lim = (ctypes.c_ulong * 2)(64, 64)  # lowering a limit is what any process may do: only the filter refuses it
attempt("setrlimit", lambda: raw(libc.prlimit(0, resource.RLIMIT_NOFILE, lim, None)))
ioctl = libc.ioctl
ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p]
attempt("tiocsti", lambda: raw(ioctl(0, TIOCSTI, b"x")))
attempt("tiocsti_upper_bits", lambda: raw(ioctl(0, TIOCSTI | 1 << 32, b"y")))  # the kernel reads 32 bits
attempt("tioclinux", lambda: raw(ioctl(0, 0x541C | 1 << 32, b"\x0b")))
n = ctypes.c_int(-1)
libc.ioctl.argtypes = None
raw(libc.ioctl(0, termios.FIONREAD, ctypes.byref(n)))  # what a lane does (FIONREAD is on its list)
out["typed_after"] = n.value
other_cpu = next(iter(victim_cpus)) if len(victim_cpus) == 1 else min(victim_cpus)
attempt("repin_other_lane", lambda: os.sched_setaffinity(victim, {other_cpu ^ 1}))
attempt("fifo_for_other_lane", lambda: os.sched_setscheduler(victim, os.SCHED_FIFO, os.sched_param(50)))
attempt("param_for_other_lane", lambda: os.sched_setparam(victim, os.sched_param(0)))
attempt("stop_other_lane", lambda: os.kill(victim, signal.SIGSTOP))
out["victim_cpus_unchanged"] = os.sched_getaffinity(victim) == victim_cpus
def pin_self():  # what the loop thread does: its own CPUs, pid 0
    os.sched_setaffinity(0, os.sched_getaffinity(0))
    out["own_pinning"] = "allowed"
t = threading.Thread(target=pin_self); t.start(); t.join()
out["cap_bounding"] = sorted({l.split()[1] for tid in os.listdir("/proc/self/task")
                              for l in open(f"/proc/self/task/{tid}/status") if l.startswith("CapBnd")})
os.close(w)  # the other lane ends (a lane cannot wait for it: wait4 is not on its list)
print(json.dumps(out), flush=True)
"""


def test_a_compromised_lane_can_do_what_a_lane_does_and_nothing_an_attacker_wants(tmp_path, children, users):
    """A process hardened as a root daemon's lane is (its own user, no capability, no_new_privs, the filter)
    serves as a lane would (a FIFO loop thread pinned by itself, memory, /proc) and is refused everything an
    attacker tries next: a socket of its own, exec, fork, writing or removing a file, a memfd, signals or ptrace
    on another process, a user namespace, root, real time for another process, write-and-execute memory, a new
    limit, typing into its controlling terminal (TIOCSTI, with or without bits above the 32 the kernel reads),
    re-pinning, re-prioritising or stopping another lane of its uid. Its bounding set ends empty, also where
    CAP_SYS_NICE was kept for the loop to take SCHED_FIFO: played as root without CAP_SYS_RESOURCE (a container),
    which cannot raise RLIMIT_RTPRIO, the one case where a lane keeps a capability for a while."""
    require_root("dropping to another user")
    target = tmp_path / "victim"
    target.write_text("root's file\n")
    os.chmod(tmp_path, 0o777)  # the directory would let the lane in: only the filter stands in the way
    lane_user = pwd.getpwnam(users.more[0])
    master, slave = os.openpty()
    try:
        r = subprocess.run([sys.executable, "-c", _ATTEMPTS,
                            str(lane_user.pw_uid), str(lane_user.pw_gid), str(target), "kept"],
                           capture_output=True, text=True, timeout=60, stdin=slave, start_new_session=True)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("kept_nice") is True
    assert out.pop("typed_before") == 1, "TIOCSTI did not type before the filter: the check below proves nothing"
    assert out.pop("typed_after") == 0, "a hardened lane typed into its terminal"
    assert out.pop("victim_cpus_unchanged") is True, "a hardened lane re-pinned another lane"
    assert out.pop("own_pinning") == "allowed"
    assert out.pop("cap_bounding") == ["0000000000000000"]
    assert out.pop("loop_policy") == os.SCHED_FIFO
    assert out.pop("read_cpuinfo") == "allowed" and out.pop("anonymous_memory") == "allowed"
    refused = {k: v for k, v in out.items() if v in ("EPERM", "ENOSYS", "EACCES")}
    assert refused == out, f"allowed to a compromised lane: {sorted(set(out) - set(refused))}"
    assert out["socket"] == "EPERM" and out["execve"] == "EPERM" and out["fork"] == "EPERM"
    for what in ("tiocsti", "tiocsti_upper_bits", "tioclinux", "repin_other_lane", "fifo_for_other_lane",
                 "param_for_other_lane", "stop_other_lane"):
        assert out[what] == "EPERM", (what, out[what])
    assert target.read_text() == "root's file\n" and not (tmp_path / "victim.new").exists()


@pytest.mark.parametrize("value, needle", [("no-such-user-x", "no such user: 'no-such-user-x'"),
                                           ("root", "is root: lanes never run as root")])
def test_a_lane_user_that_cannot_be_is_refused_with_its_line(tmp_path, bundles, value, needle):
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": "cam0"}], runtime={"lane_user": value})
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert re.search(r"edgeinferd\.yaml:\d+: runtime\.lane_user", str(e.value)), str(e.value)  # file:line: key
    assert needle in str(e.value), str(e.value)


def _steal_fd(pid: int, fd: int) -> int:
    """A copy of fd `fd` of process `pid` (pidfd_getfd(2); root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd
        if got < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return got
    finally:
        os.close(pidfd)


class _Boom:
    """Unpickled, it would create `path`: what a compromised lane would send a control plane that unpickles."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_compromised_lane_cannot_run_code_in_the_control_plane(bundles, children, tmp_path, stream):
    """A lane speaks JSON messages, each field checked (lanes/protocol.py); the control plane never unpickles what a
    lane sends. Played with the lane's own socket (taken from it with pidfd_getfd, as code running in the lane
    could use it): a pickle that would run code, a message naming a stream the lane does not hold, a log
    level that is not one, and rollout reports that cannot be true. Each time: no code runs, the lane is killed and restarted with the reason, and the
    stream is served again."""
    require_root("taking a lane's socket with pidfd_getfd")
    cfg = write_config(tmp_path, bundles("orientation"),
                       [{"name": stream, "width": 224, "height": 224, "max_age_ms": 60000}])
    proc = start_daemon(children, cfg, log_file=str(tmp_path / "daemon.log"))
    frames = [f for f, _ in make_frames(224, 224, pages=2)]
    marker = tmp_path / "ran"
    attacks = [pickle.dumps(_Boom(str(marker))),
               json.dumps(["Dropped", 4095, 1, "a stream that is not the lane's"]).encode(),
               json.dumps(["Log", "critical", "an arbitrary logger method"]).encode(),
               # A rollout's report that would sway a promotion: more answers agreed than compared, and one for
               # a model the lane does not hold (control/rollout.py decides on these).
               json.dumps(["TrialReport", "default", "9.9.9", 10, 99, 10, 10, 0, 0, [], [], None]).encode(),
               json.dumps(["TrialReport", "other", "9.9.9", 10, 10, 10, 10, 0, 0, [], [], None]).encode()]
    for n, payload in enumerate(attacks, 1):
        lanes = _lanes_of(proc.pid)
        assert lanes
        victim = lanes[0]
        socks = [int(fd) for fd in os.listdir(f"/proc/{victim}/fd")
                 if os.readlink(f"/proc/{victim}/fd/{fd}").startswith("socket:")]
        assert len(socks) == 1, socks  # its one socket: to the control plane
        s = socket.socket(fileno=_steal_fd(victim, socks[0]))
        try:
            s.send(payload)
        finally:
            s.close()
        deadline = time.monotonic() + 30
        while victim in _lanes_of(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim not in _lanes_of(proc.pid), f"attack {n}: the lane that broke the protocol still runs"
        assert len(feed_and_collect(proc, stream, frames, 5, per_frame_timeout=30)) == 5
        assert daemon_log(proc).count("broke the lane protocol") == n, daemon_log(proc)[-3000:]
    assert not marker.exists(), "the control plane ran code a lane sent"
    assert stop_daemon(proc) == 0


_REPIN = _ATTEMPT + r"""
import errno, json, os, signal, sys
from edgeinfer.support import sandbox
uid, gid, victim_lane = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sandbox.harden_lane(sandbox.LaneIdentity(uid, gid, "lane"), "other", 0)
out = {}
for tid in map(int, os.listdir(f"/proc/{victim_lane}/task")):
    cpus = os.sched_getaffinity(tid)
    attempt(f"repin {tid}", lambda: os.sched_setaffinity(tid, set(range(os.cpu_count())) - cpus or cpus))
    attempt(f"demote {tid}", lambda: os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0)))
attempt("stop", lambda: os.kill(victim_lane, signal.SIGSTOP))
print(json.dumps(out), flush=True)
"""


def _uids_of(pid: int) -> list[str]:
    try:
        return _status(f"/proc/{pid}/status")["Uid"].split()
    except (OSError, KeyError):
        return []  # gone meanwhile


def _loops(lanes: list[int]) -> dict[int, tuple]:
    """{loop thread: (its CPUs, its policy)} of every lane."""
    out = {}
    for pid in lanes:
        for tid in os.listdir(f"/proc/{pid}/task"):
            if _status(f"/proc/{pid}/task/{tid}/status")["Name"].startswith("edgeinfer-rt"):
                out[int(tid)] = (os.sched_getaffinity(int(tid)), os.sched_getscheduler(int(tid)))
    return out


def test_a_lane_cannot_repin_stop_or_demote_another_and_nobody_cannot_stop_one(bundles, children, tmp_path, stream):
    """Two lanes of a root daemon. Code running as one of them (a process hardened as a lane is, with the lanes'
    uid) tries to re-pin, demote and SIGSTOP the other's threads: each refused (EPERM). Without the edgeinfer user
    the lanes run under a dynamic uid no other process has, so a process running as `nobody` cannot SIGSTOP a lane
    either (it could when lanes ran as nobody). The victim's loops keep their CPUs and SCHED_FIFO, and its stream
    is served every frame before and after."""
    require_root("a daemon started as root")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two lanes need two CPUs")
    cfg = write_config(tmp_path, bundles("orientation"),
                       [{"name": stream, "width": 224, "height": 224, "max_age_ms": 60000}],
                       lanes=[{"cpus": [cpus[0]]}, {"cpus": [cpus[1]]}])
    proc = start_daemon(children, cfg, log_file=str(tmp_path / "daemon.log"))
    frames = [f for f, _ in make_frames(224, 224, pages=2)]
    assert len(feed_and_collect(proc, stream, frames, 20)) == 20
    lanes = _lanes_of(proc.pid)
    assert len(lanes) == 2, lanes
    before = _loops(lanes)
    assert len(before) == 2 and all(policy == os.SCHED_FIFO for _, policy in before.values()), before
    uid, gid = (int(_status(f"/proc/{lanes[0]}/status")[k].split()[0]) for k in ("Uid", "Gid"))
    r = subprocess.run([sys.executable, "-c", _REPIN, str(uid), str(gid), str(lanes[1])],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out and all(v == "EPERM" for v in out.values()), out
    try:
        pwd.getpwnam(sandbox.DEFAULT_LANE_USER)
    except KeyError:  # no dedicated user: a dynamic uid, which no other process holds
        assert uid in sandbox.DYNAMIC_UIDS, uid
        holders = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in lanes and
                   str(uid) in _uids_of(int(p))]
        assert not holders, f"another process holds the lanes' uid {uid}: {holders}"
    k = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                        "kill", "-STOP", str(lanes[1])], capture_output=True, text=True, timeout=30)
    assert k.returncode != 0 and "Operation not permitted" in k.stderr, (k.returncode, k.stderr)
    assert _status(f"/proc/{lanes[1]}/status")["State"][0] in "SR", "a lane was stopped"
    assert _loops(lanes) == before, "a lane's loop was re-pinned or demoted"
    assert len(feed_and_collect(proc, stream, frames, 20)) == 20
    assert _lanes_of(proc.pid) == lanes, "a lane was restarted"
    assert stop_daemon(proc) == 0
