"""Resource faults: a full shared-memory filesystem, a full or read-only state
directory, and the daemon's fd and address-space limits reached while it runs.

The full/read-only filesystems are small tmpfs mounts made for the test (root
only; CI runs as root), pointed at by shm.dir and model.state_dir — the same
code paths as /dev/shm and /var/lib/edgeinfer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import IN_CI, read_line
from daemon_helpers import daemon_log, poll, read_stats, stop_daemon, wait_for
from rel_helpers import checksum_ok, drain, fault_daemon, http_status, stream_of

from edgeinfer import ring


@pytest.fixture
def small_fs(tmp_path):
    """mount(size) → a fresh tmpfs of that size; unmounted afterwards, whatever happened."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("resource-fault tests mount small filesystems: CI runs them as root")
        pytest.skip("resource-fault tests mount small filesystems: they need root")
    mounted = []

    def mount(size: str, name: str) -> str:
        d = tmp_path / name
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(d)], check=True)
        mounted.append(str(d))
        return str(d)
    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", d], check=False)


def _fill(directory: str) -> None:
    """Takes every free byte of a filesystem."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_shm_full_when_producers_create_rings(request, matrix, tmp_path, small_fs, shm_name, children, c_producer,
                                              signing_key):
    shm = small_fs("2m", "shm")
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name, shm={"dir": shm})
    stream = stream_of(shm_name)
    results = ring.ResultReader.watch(ring.result_segment_name(stream), shm_dir=shm)
    small = children.spawn([c_producer, shm_name, "64", "48", "--fps", "50", "--dir", shm])
    read_line(small)
    feed = [sys.executable, "-m", "edgeinfer.cli", "feed", "--synthetic", "--fps", "5", "--shm-dir", shm]
    attempts = [[c_producer, "edgeinfer.big", "640", "480", "--dir", shm],
                [c_producer, "edgeinfer.huge", "1920", "1080", "--slots", "8", "--dir", shm],
                feed + ["--stream", "big-py", "--width", "640", "--height", "480"]] * 5
    clear = sigbus = 0
    try:
        for args in attempts:
            r = subprocess.run(args, capture_output=True, text=True, timeout=60)
            sigbus += r.returncode == -7
            clear += r.returncode == 1 and "No space left on device" in r.stderr
        # Fill the rest: the camera restarting now cannot get its new segment either.
        _fill(shm)
        small.kill(), small.wait(10)
        r = subprocess.run([c_producer, shm_name, "64", "48", "--dir", shm], capture_output=True, text=True,
                           timeout=60)
        restart_clear = r.returncode == 1 and "No space left on device" in r.stderr
        os.unlink(os.path.join(shm, "filler"))
        again = children.spawn([c_producer, shm_name, "64", "48", "--fps", "50", "--dir", shm])
        read_line(again)
        got = poll(lambda: drain(results), 10)
        daemon_ok = proc.poll() is None and http_status(proc.metrics_url + "/healthz") == 200
        leftovers = [e for e in os.listdir(shm) if e.startswith(".")]
    finally:
        results.close()
    stop_daemon(proc)
    observed = (f"{clear}/{len(attempts)} refused with 'No space left on device' (C and Python producers), "
                f"{sigbus} SIGBUS; camera restart into a full fs refused clearly: {restart_clear}; after space "
                f"returned: {len(got)} results, all whole: {all(map(checksum_ok, got))}; daemon alive and healthy: "
                f"{daemon_ok}; temp files left: {len(leftovers)}")
    passed = clear == len(attempts) and sigbus == 0 and restart_clear and got and all(map(checksum_ok, got)) \
        and daemon_ok and not leftovers
    assert matrix.record(request, "resource", "shared-memory filesystem full (2 MiB tmpfs) when rings are created",
                         len(attempts) + 1, "clear error at create (space reserved up front), no SIGBUS anywhere; "
                         "the daemon serves on", observed, passed)


def test_state_dir_full_then_read_only(request, matrix, tmp_path, small_fs, shm_name, children, signing_key):
    import fault_models
    key = signing_key[0]
    state = small_fs("64k", "state")
    state_file = os.path.join(state, "model-versions.json")
    with open(state_file, "w") as f:
        json.dump({"fault-checksum": {"highest": "0.9.0"}}, f)
    original = open(state_file, "rb").read()
    _fill(state)
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name, state_dir=state)
    st = poll(lambda: read_stats(stats), 10)
    full_serving = proc.poll() is None and st.get("state_write_failures", 0) >= 1 and \
        open(state_file, "rb").read() == original
    # Space comes back: the write is retried and the floor rises to 1.0.0.
    os.unlink(os.path.join(state, "filler"))
    recorded = poll(lambda: json.load(open(state_file)).get("fault-checksum", {}).get("highest") == "1.0.0", 20)
    # Read-only: a reload to 1.0.1 still serves; the CLI override fails with the reason.
    subprocess.run(["mount", "-o", "remount,ro", state], check=True)
    after_retry = open(state_file, "rb").read()
    newer = fault_models.signed_bundle("checksum", tmp_path / "bundle-101", key, version="1.0.1")
    cfg_text = open(tmp_path / "edgeinferd.yaml").read()
    bundle_now = cfg_text.split("bundle: ", 1)[1].split("\n", 1)[0]
    os.rename(bundle_now, bundle_now + ".old")
    os.symlink(newer, bundle_now)
    failures_before = read_stats(stats).get("state_write_failures", 0)
    proc.send_signal(1)  # SIGHUP
    poll(lambda: (read_stats(stats).get("model") or {}).get("version") == "1.0.1"
         and read_stats(stats).get("state_write_failures", 0) > failures_before, 20)
    st = read_stats(stats)
    ro_serving = (st.get("model") or {}).get("version") == "1.0.1" and open(state_file, "rb").read() == after_retry
    cli = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "model", "allow-downgrade", "fault-checksum", "0.5",
                          "--state-dir", state], capture_output=True, text=True, timeout=60)
    cli_clear = cli.returncode == 1 and "cannot write the anti-rollback state (Read-only file system)" in cli.stderr
    alive = http_status(proc.metrics_url + "/healthz") == 200
    stop_daemon(proc)
    log = daemon_log(proc)
    logged = "cannot write the anti-rollback state (No space left on device)" in log
    leftovers = [e for e in os.listdir(state) if e.startswith(".")]
    observed = (f"full: serving 1.0.0, error logged {logged}, state file unchanged {full_serving}; space back: "
                f"floor written 1.0.0 {recorded}; read-only: reload to 1.0.1 served, state unchanged {ro_serving}; "
                f"allow-downgrade exit {cli.returncode} with the reason {cli_clear}; temp files left "
                f"{len(leftovers)}; healthy {alive}")
    passed = full_serving and logged and recorded and ro_serving and cli_clear and not leftovers and alive
    assert matrix.record(request, "resource", "state directory full, then read-only, during version writes", 3,
                         "old state intact, clear error, the verified model still served; written once possible",
                         observed, passed)


def _first_stream_served(children, tmp_path, signing_key, shm_name, c_producer, extra):
    """The daemon with `extra` streams configured, and its first stream already being served."""
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, shm_name, extra_streams=extra)
    read_line(children.spawn([c_producer, shm_name, "64", "48", "--fps", "50"]))
    results = ring.ResultReader.watch(ring.result_segment_name(stream_of(shm_name)))
    wait_for(lambda: drain(results), 20, "the first stream to be served")
    return proc, stats, results


def _limit(pid: int, resource: str, value: int | str) -> None:
    """Sets the soft limit only: raising it again needs no privilege."""
    subprocess.run(["prlimit", "--pid", str(pid), f"--{resource}={value}:"], check=True)


def test_fd_limit_reached_while_streams_attach(request, matrix, tmp_path, shm_name, children, c_producer,
                                               signing_key):
    """RLIMIT_NOFILE lowered to what the running daemon has open: the cameras that
    appear then cannot be attached (EMFILE) and are reported; the attached stream
    is served throughout; once the limit is raised they are attached by themselves."""
    others = [f"{shm_name}-{i}" for i in range(3)]
    extra = [{"name": stream_of(n), "width": 64, "height": 48, "max_age_ms": 60000} for n in others]
    proc, stats, results = _first_stream_served(children, tmp_path, signing_key, shm_name, c_producer, extra)
    try:
        open_fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        _limit(proc.pid, "nofile", open_fds)
        for n in others:
            read_line(children.spawn([c_producer, n, "64", "48", "--fps", "50"]))
        time.sleep(1.5)  # the stats file cannot be written now either (no fd): the log tells
        served_meanwhile = len(drain(results))
        _limit(proc.pid, "nofile", 4096)
        processed = [lambda n=n: read_stats(stats).get("streams", {}).get(stream_of(n), {}).get("processed", 0)
                     for n in others]
        poll(lambda: all(p() > 0 for p in processed), 10)
        st = read_stats(stats)
        recovered = sum(st.get("streams", {}).get(stream_of(n), {}).get("processed", 0) > 0 for n in others)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        results.close()
    stop_daemon(proc)
    log = daemon_log(proc)
    emfile = sum(f"stream {stream_of(n)}: segment refused: " in log and "Too many open files" in
                 log.split(f"stream {stream_of(n)}: segment refused: ", 1)[1].split("\n", 1)[0] for n in others)
    observed = (f"limit = {open_fds} fds (all in use): {emfile}/{len(others)} new cameras refused with 'Too many "
                f"open files' in the log; first stream served {served_meanwhile} results meanwhile; after raising "
                f"the limit {recovered}/{len(others)} attached and served; healthy {alive}")
    passed = emfile == len(others) and served_meanwhile > 0 and recovered == len(others) and alive
    assert matrix.record(request, "resource", "open-file limit reached (RLIMIT_NOFILE = fds in use)", len(others),
                         "new cameras refused with the reason, others served, recovery without restart", observed,
                         passed)


def test_address_space_limit_reached_by_a_big_ring(request, matrix, tmp_path, shm_name, children, c_producer,
                                                   signing_key):
    """RLIMIT_AS lowered to the daemon's size + 64 MiB; a camera with a 4K
    ring (8 slots, ~200 MB) cannot be mapped: refused with the reason; the
    other stream is served; raising the limit lets it in."""
    big = shm_name + "-4k"
    extra = [{"name": stream_of(big), "max_age_ms": 60000}]
    proc, stats, results = _first_stream_served(children, tmp_path, signing_key, shm_name, c_producer, extra)
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            vm_kib = next(int(x.split()[1]) for x in f if x.startswith("VmSize:"))
        _limit(proc.pid, "as", (vm_kib + 64 * 1024) * 1024)
        read_line(children.spawn([c_producer, big, "3840", "2160", "--slots", "8", "--fps", "2"]))
        time.sleep(1.5)
        st = read_stats(stats)
        refused = st["streams"][stream_of(big)].get("refused") or ""
        served_meanwhile = len(drain(results))
        still_alive = proc.poll() is None and st.get("loop_alive")
        _limit(proc.pid, "as", "unlimited")
        attached = poll(lambda: read_stats(stats).get("streams", {}).get(stream_of(big), {}).get("connected"), 15)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        results.close()
    stop_daemon(proc)
    observed = (f"limit VmSize+64 MiB: 4K ring refused with {refused[-90:]!r}; first stream served "
                f"{served_meanwhile} results meanwhile, loop alive {still_alive}; limit lifted: attached {attached}; "
                f"healthy {alive}")
    passed = "Cannot allocate memory" in refused and served_meanwhile > 0 and still_alive and attached and alive
    assert matrix.record(request, "resource", "address-space limit (RLIMIT_AS) reached by a new camera's ring", 1,
                         "that camera refused with the reason, the rest served, recovery without restart", observed,
                         passed)
