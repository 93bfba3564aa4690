"""Access: segments the daemon must refuse, a result ring an outsider cannot
read, and the metrics listener on loopback by default. (A producer outside
the `edgeinfer` group, with real users and the installed package, is checked
in the booted container: tests/system/inside.sh, row "outsider_refused".)"""
from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest
from conftest import IN_CI
from daemon_helpers import daemon_log, read_stats, stop_daemon
from rel_helpers import fault_daemon, http_status, stream_of

from edgeinfer import ring


def _refusal(stats: str, stream: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = read_stats(stats).get("streams", {}).get(stream, {}).get("refused")
        if said:
            return said
        time.sleep(0.05)
    return ""


def test_insecure_segments_are_refused(request, matrix, tmp_path, shm_name, children, signing_key):
    """World-writable, and owned by a uid outside shm.allowed_uids: refused with
    the reason, never served; a proper segment under the same name afterwards is."""
    ww = ring.FrameWriter.create(shm_name, 64, 48, "bgr24")
    os.chmod(f"/dev/shm/{shm_name}", 0o666)
    ww.begin()
    ww.publish(frame_id=1)
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name)
    stream = stream_of(shm_name)
    world = _refusal(stats, stream)
    served_ww = read_stats(stats)["streams"][stream]["processed"]
    ww.close()
    stop_daemon(proc)

    other = tmp_path / "owner"
    other.mkdir()
    w2 = ring.FrameWriter.create(shm_name, 64, 48, "bgr24")  # owned by us (root): not in allowed_uids
    w2.begin()
    w2.publish(frame_id=1)
    proc, stats, _ = fault_daemon(children, other, signing_key, shm_name, shm={"allowed_uids": "[4242]"})
    owner = _refusal(stats, stream)
    served_owner = read_stats(stats)["streams"][stream]["processed"]
    w2.close()
    stop_daemon(proc)
    log = daemon_log(proc)
    observed = (f"world-writable: {world[-70:]!r}; owner outside allowed_uids: {owner[-70:]!r}; frames served "
                f"from them: {served_ww + served_owner}; refusal logged: {'segment refused' in log}")
    passed = "world-writable" in world and "not an allowed producer" in owner and served_ww + served_owner == 0 and \
        "segment refused" in log
    assert matrix.record(request, "access", "world-writable segment; segment owned by a uid outside "
                         "shm.allowed_uids", 2, "refused with the reason, nothing served", observed, passed)


def test_result_ring_closed_to_outsiders(request, matrix, tmp_path, shm_name, children, signing_key):
    """A process outside the result ring's group (uid/gid 65534, no groups)
    cannot open it. (It runs `dd`, not edgeinferctl: the checkout and its .venv
    may sit in a directory that user cannot enter, e.g. a 0700 temp dir.)"""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("needs root to run a process as another user")
        pytest.skip("needs root to run a process as another user")
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name)
    stream = stream_of(shm_name)
    mode = oct(os.stat(f"/dev/shm/{ring.result_segment_name(stream)}").st_mode & 0o777)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "dd", "status=none",
                        f"if=/dev/shm/{ring.result_segment_name(stream)}", "of=/dev/null", "count=1"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    stop_daemon(proc)
    observed = f"result ring mode {mode}; outsider: exit {r.returncode}, {r.stderr.strip()[-110:]!r}"
    passed = mode == "0o660" and r.returncode == 1 and "permission denied" in r.stderr.lower()
    assert matrix.record(request, "access", "reader outside the result ring's group", 1,
                         "cannot open the ring", observed, passed)


def test_metrics_listener_is_loopback_by_default(request, matrix, tmp_path, shm_name, children, signing_key):
    from edgeinfer.config import MetricsConfig
    default = MetricsConfig().listen
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name, metrics={"listen": None})
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
