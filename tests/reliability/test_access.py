"""Access: bad ring fds handed to the daemon over its real socket, results closed
to users outside the sockets' group and to users not among a stream's readers
(real unprivileged users), and the metrics listener on loopback by default.

(Which user may produce which stream, and what one camera can do to another,
is the isolation campaign: tests/reliability/test_isolation.py.)"""
from __future__ import annotations

import os
import select
import socket
import stat
import struct
import subprocess
import uuid

from conftest import read_line
from daemon_helpers import daemon_log, poll, read_stats, results, stop_daemon
from rel_helpers import checksum_ok, drain, fault_daemon, http_status
from ring_helpers import F_SEAL_WRITE, FRAME_SEALS, memfd_with, ring_bytes

from edgeinfer.abi import ring


def _hand_over(path: str, stream: str, fd: int, timeout: float = 10.0) -> tuple[int, str]:
    """A producer's hello for `stream` with `fd` attached (SCM_RIGHTS), over the daemon's ingress socket:
    (status, reason) of its reply (ring.h: ei_hello, ei_reply)."""
    hello = b"EIHELLO2" + struct.pack("<II", ring._ring.ABI_VERSION, ring.ROLE_PRODUCER) + \
        stream.encode().ljust(64, b"\0") + bytes(48)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        s.sendmsg([hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
        if not select.select([s], [], [], timeout)[0]:
            return 0, f"no reply within {timeout} s"
        reply = s.recv(512)
    if len(reply) != 256 or reply[:8] != b"EIREPLY2":
        return 0, f"not a reply: {reply[:40]!r}"
    status = struct.unpack_from("<i", reply, 12)[0]
    return status, reply[16:].split(b"\0", 1)[0].decode(errors="replace")


def test_bad_ring_fds_are_refused_over_the_socket(request, matrix, tmp_path, stream, children, c_producer,
                                                  signing_key):
    """ABI 1's insecure segments (world-writable, owned by a stranger) cannot exist in ABI 2:
    a ring is an fd handed over a socket, and every check of that fd is tested case by case
    in tests/unit/test_ring_validation.py. This row hands the running daemon each kind of bad fd
    over its real ingress socket, as the stream's own producer would — an unsealed memfd,
    a file in /dev/shm (a named ring as in ABI 1), a pipe, a write-sealed memfd, each
    holding a valid ring where it can — and checks each is refused with its reason and
    counted, and nothing is served from them, while the daemon serves an honest stream."""
    target = stream + "-bad"
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream,
                                  extra_streams=[{"name": target, "width": 64, "height": 48, "max_age_ms": 60000}])
    honest = children.spawn([c_producer, stream, "64", "48", "--fps", "50", "--socket", proc.ingress])
    read_line(honest)
    reader = results(proc, stream)
    image = ring_bytes(64, 48)  # a valid ring: only the fd is wrong
    shm_path = f"/dev/shm/edgeinfer-test-{uuid.uuid4().hex[:8]}"

    def shm_file():
        fd = os.open(shm_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, image)
        return fd

    def pipe():
        r, w = os.pipe()
        os.close(w)
        return r
    cases = [("unsealed memfd", lambda: memfd_with(image, 0), "the memfd is not sealed"),
             ("/dev/shm file", shm_file, "is a named file"),
             ("pipe", pipe, "not a memfd (not a regular file"),
             ("write-sealed memfd", lambda: memfd_with(image, FRAME_SEALS | F_SEAL_WRITE), "is write-sealed")]
    said, right, got = [], 0, []
    try:
        got.extend(drain(reader))
        for name, make, reason in cases:
            fd = make()
            try:
                status, msg = _hand_over(proc.ingress, target, fd)
            finally:
                os.close(fd)
            said.append(f"{name}: {msg[msg.find(': the') + 2 if ': the' in msg else 0:][:70]!r}")
            right += status == ring.STATUS["insecure"] and reason in msg and target in msg
            got.extend(drain(reader))
        after = ring.monotonic_ns()
        later = []
        poll(lambda: later.extend(r for r in drain(reader) if r.capture_ns > after) or len(later) >= 20, 10)
        got.extend(later)
        poll(lambda: read_stats(stats).get("refusals", {}).get(f"{target}/producer/bad_ring", 0) >= len(cases), 5)
        st = read_stats(stats)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        reader.close()
        if os.path.exists(shm_path):
            os.unlink(shm_path)
    stop_daemon(proc)
    log = daemon_log(proc)
    counted = st.get("refusals", {}).get(f"{target}/producer/bad_ring", 0)
    s_bad = st.get("streams", {}).get(target, {})
    logged = sum("producer refused:" in x and target in x for x in log.splitlines())
    observed = (f"{right}/{len(cases)} refused with their reason: {'; '.join(said)}; counted {counted} "
                f"(bad_ring), logged {logged} (rate-limited); frames served from them {s_bad.get('offered', '?')}, "
                f"attached {s_bad.get('attaches', '?')}; honest stream {len(got)} results meanwhile "
                f"({len(later)} after the last refusal), all whole {all(map(checksum_ok, got))}; healthy {alive}")
    passed = (right == len(cases) and counted == len(cases) and logged >= 1 and s_bad.get("offered") == 0
              and s_bad.get("attaches") == 0 and len(later) >= 20 and all(map(checksum_ok, got)) and alive)
    assert matrix.record(request, "access", "bad ring fds over the ingress socket: unsealed memfd, /dev/shm file, "
                         "pipe, write-sealed memfd", len(cases), "each refused with its reason and counted, nothing "
                         "served from them; an honest stream served meanwhile", observed, passed)


def test_results_closed_to_outsiders_and_to_non_readers(request, matrix, tmp_path, stream, children, signing_key,
                                                        users, sandbox, c_producer, c_reader):
    """Real unprivileged users, running the C reader (from the sandbox: the checkout may
    sit where they cannot enter). The results socket is the only way to a result ring
    (a memfd: no name to open). A user outside the sockets' group cannot connect to it
    at all; a user in the group but not in the stream's `readers` is refused with the
    reason (and counted); the stream's reader gets its results."""
    ingress = {"socket": sandbox / f"{stream}-ingress.sock", "results_socket": sandbox / f"{stream}-results.sock",
               "socket_group": users.group}
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, ingress=ingress,
                                  stream_keys={"readers": f"{{users: [{users.reader}]}}"})
    st_sock = os.stat(proc.results)
    mode = f"{stat.S_IMODE(st_sock.st_mode):04o}, group {'ok' if st_sock.st_gid == users.gid else st_sock.st_gid}"
    prod = children.spawn([c_producer, stream, "64", "48", "--fps", "50", "--socket", proc.ingress])
    read_line(prod)

    def read_as(user: str):
        return subprocess.run(users.run_as(user) + [c_reader, stream, "--socket", proc.results, "--count", "3",
                                                    "--timeout", "10"], capture_output=True, text=True, timeout=60,
                              cwd="/")
    outsider, non_reader, reader = read_as(users.outsider), read_as(users.cam_b), read_as(users.reader)
    poll(lambda: read_stats(stats).get("refusals", {}).get(f"{stream}/reader/identity", 0) >= 1, 5)
    st = read_stats(stats)
    stop_daemon(proc)
    counted = st.get("refusals", {})
    log = daemon_log(proc)
    got = [x for x in reader.stdout.splitlines() if x.startswith("RESULT ")]
    observed = (f"results socket mode {mode}; outsider ({users.outsider}, not in the group): exit "
                f"{outsider.returncode}, {outsider.stderr.strip()[-90:]!r}; group member not among the readers "
                f"({users.cam_b}): exit {non_reader.returncode}, {non_reader.stderr.strip()[-90:]!r}; the stream's "
                f"reader ({users.reader}): exit {reader.returncode}, {len(got)} results; refusals counted "
                f"{counted}; logged {'reader refused:' in log}")
    passed = (mode == "0660, group ok" and outsider.returncode == 1 and "permission denied" in outsider.stderr.lower()
              and non_reader.returncode == 1 and f"may not read stream {stream}" in non_reader.stderr
              and reader.returncode == 0 and len(got) == 3 and counted == {f"{stream}/reader/identity": 1}
              and "reader refused:" in log)
    assert matrix.record(request, "access", "result readers: a user outside the sockets' group; a group member not "
                         "in the stream's readers (real users)", 2, "the outsider cannot connect; the non-reader is "
                         "refused with the reason and counted; the stream's reader is served", observed, passed)


def test_metrics_listener_is_loopback_by_default(request, matrix, tmp_path, stream, children, signing_key):
    from edgeinfer.config.schema import MetricsConfig
    default = MetricsConfig().listen
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, metrics={"listen": None})
    url = proc.metrics_url
    port = int(url.rsplit(":", 1)[1])
    local = http_status(url + "/healthz") == 200
    # Every non-loopback address of this host: the port must not answer there.
    addrs = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    reachable = []
    for a in addrs:
        s = socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET)
        s.settimeout(1)
        try:
            s.connect((a, port))
            reachable.append(a)
        except OSError:
            pass
        finally:
            s.close()
    stop_daemon(proc)
    observed = f"default listen {default}; daemon said {url}; answers on loopback {local}; " \
               f"reachable on {addrs or 'no other address'}: {reachable or 'none'}"
    passed = default.startswith("127.0.0.1:") and url.startswith("http://127.0.0.1:") and local and not reachable \
        and addrs
    assert matrix.record(request, "access", "metrics listener with the default config", 1,
                         "bound to 127.0.0.1 only", observed, passed)
