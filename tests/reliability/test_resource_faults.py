"""Resource faults: a producer's memory cgroup smaller than its ring, a full or
read-only state directory, and the daemon's fd and address-space limits reached
while it runs.

The full/read-only state directory is a small tmpfs mount made for the test
(root only; CI runs as root), pointed at by model.state_dir — the same code
path as /var/lib/edgeinfer. The memory limit is a cgroup v1 memory cgroup made
under this process's own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import IN_CI, read_line
from daemon_helpers import daemon_log, poll, read_stats, results, stop_daemon, wait_for
from rel_helpers import Lines, checksum_ok, drain, fault_daemon, http_status, stream_stats, wait_exit

from edgeinfer.abi import ring


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


@pytest.fixture
def memory_cgroup(tmp_path):
    """A child of this process's cgroup v1 memory cgroup, limited to `limit` bytes (no swap either);
    `cg.wrap(args)` runs a program inside it. Removed afterwards (what is still in it is killed)."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("the memory-cgroup row creates a cgroup: CI runs it as root")
        pytest.skip("the memory-cgroup row creates a cgroup: it needs root")
    mine = next((line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                 if line.split(":")[1] == "memory"), None)
    base = f"/sys/fs/cgroup/memory{mine}" if mine is not None else None
    if base is None or not os.path.exists(os.path.join(base, "memory.limit_in_bytes")):
        message = "no cgroup v1 memory controller here (/proc/self/cgroup names no memory cgroup, or " \
                  "/sys/fs/cgroup/memory is not mounted)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)

    class Cgroup:
        path = os.path.join(base, f"edgeinfer-test-{uuid.uuid4().hex[:8]}")

        def read(self, name: str) -> str:
            with open(os.path.join(self.path, name)) as f:
                return f.read()

        def counter(self, name: str, key: str | None = None) -> int:
            text = self.read(name)
            if key is None:
                return int(text)
            return int(next((x.split()[1] for x in text.splitlines() if x.split()[0] == key), -1))

        def wrap(self, args: list[str]) -> list[str]:
            return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *args]

    cg = Cgroup()
    os.mkdir(cg.path)
    try:
        with open(os.path.join(cg.path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(CGROUP_LIMIT))
        try:  # with swap, memory+swap too (the ring's pages could go to swap instead of failing)
            with open(os.path.join(cg.path, "memory.memsw.limit_in_bytes"), "w") as f:
                f.write(str(CGROUP_LIMIT))
        except OSError:
            pass
        yield cg
    finally:
        for pid in open(os.path.join(cg.path, "cgroup.procs")).read().split():  # only processes this test started
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(100):
            try:
                os.rmdir(cg.path)
                break
            except OSError:
                time.sleep(0.05)


CGROUP_LIMIT = 64 << 20


def test_memory_cgroup_limit_when_a_producer_creates_its_ring(request, matrix, tmp_path, memory_cgroup, stream,
                                                              children, c_producer, signing_key):
    """ABI 1's "/dev/shm full" becomes, with memfd rings, a memory limit: a ring's pages are
    charged to the memory cgroup of the process that creates it. A producer in a cgroup
    limited to 64 MiB asks for rings larger than that: it must fail at ring creation (every
    page is reserved there, before the ring is handed over) — killed by its own cgroup's
    OOM killer or told ENOMEM, either is accepted and reported — never later, and never
    anyone else: the daemon serves its other stream throughout. A ring that fits in the
    same cgroup is served, and its producer is never charged again after creation."""
    other = stream + "-big"
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream,
                                  extra_streams=[{"name": other, "max_age_ms": 60000}])
    reader = results(proc, stream)
    small = children.spawn([c_producer, stream, "64", "48", "--fps", "50", "--socket", proc.ingress])
    read_line(small)
    too_big = [["1920", "1080", "--slots", "16"], ["3840", "2160", "--slots", "8"]] * 3  # ~100 MB, ~200 MB
    outcomes, got = [], []
    oom_before = memory_cgroup.counter("memory.oom_control", "oom_kill")
    started = ring.monotonic_ns()
    try:
        for geometry in too_big:
            oom = memory_cgroup.counter("memory.oom_control", "oom_kill")
            r = subprocess.run(memory_cgroup.wrap([c_producer, other, *geometry, "--socket", proc.ingress]),
                               capture_output=True, text=True, timeout=120)
            got.extend(drain(reader))
            killed = r.returncode == -signal.SIGKILL and memory_cgroup.counter("memory.oom_control", "oom_kill") > oom
            enomem = r.returncode == 1 and "cannot reserve" in r.stderr and "Cannot allocate memory" in r.stderr
            outcomes.append("oom-killed" if killed else "ENOMEM" if enomem else
                            f"exit {r.returncode}: {(r.stdout + r.stderr).strip()[-80:]!r}")
            outcomes[-1] += "" if not r.stdout.strip() else f" after saying {r.stdout.strip()[:40]!r}"
        fit = children.spawn(memory_cgroup.wrap([c_producer, other, "640", "480", "--slots", "40", "--fps", "100",
                                                 "--socket", proc.ingress]))
        fit_line = read_line(fit, 30)
        fail_after_create = memory_cgroup.counter("memory.failcnt")
        usage = memory_cgroup.counter("memory.usage_in_bytes")
        fit_served = poll(lambda: stream_stats(stats, other).get("processed", 0) >= 100, 20)
        got.extend(drain(reader))
        fail_at_end = memory_cgroup.counter("memory.failcnt")
        fit_alive = fit.poll() is None
        fit.send_signal(signal.SIGTERM)
        fit_done = wait_exit(fit, 10) == 0
        after = ring.monotonic_ns()
        got.extend(poll(lambda: [r for r in drain(reader) if r.capture_ns > after], 10) or [])
        oom_total = memory_cgroup.counter("memory.oom_control", "oom_kill") - oom_before
        st = read_stats(stats)
        s_other = st.get("streams", {}).get(other, {})
        daemon_ok = proc.poll() is None and http_status(proc.metrics_url + "/healthz") == 200
    finally:
        reader.close()
    stop_daemon(proc)
    failed_at_create = sum(o in ("oom-killed", "ENOMEM") for o in outcomes)
    kinds = {k: outcomes.count(k) for k in sorted(set(outcomes))}
    served_throughout = [r for r in got if r.capture_ns >= started]
    observed = (f"cgroup limit {CGROUP_LIMIT >> 20} MiB: {failed_at_create}/{len(too_big)} rings of ~100/200 MB failed "
                f"at creation ({kinds}; OOM kills counted by the cgroup: {oom_total}), none connected "
                f"(producers of that stream the daemon accepted: {s_other.get('attaches', '?')}, the fitting one; "
                f"refusals {s_other.get('refused') or 0}); a 37 MB ring in the same cgroup: {fit_line!r}, "
                f"{s_other.get('processed', 0)} frames served, cgroup usage {usage >> 20} MiB, limit hits after "
                f"creation {fail_at_end - fail_after_create}, alive {fit_alive}; other stream: {len(got)} results, all "
                f"whole {all(map(checksum_ok, got))}, {len(served_throughout)} during and after the big rings; "
                f"daemon alive and healthy: {daemon_ok}")
    passed = (failed_at_create == len(too_big) and oom_total == outcomes.count("oom-killed")
              and s_other.get("attaches") == 1 and not s_other.get("refused") and fit_line == "CONNECTED accepted=1"
              and fit_served and fail_at_end == fail_after_create and fit_alive and fit_done
              and got and all(map(checksum_ok, got)) and served_throughout and daemon_ok)
    assert matrix.record(request, "resource", f"memory cgroup limit ({CGROUP_LIMIT >> 20} MiB) smaller than the "
                         "ring a producer creates", len(too_big), "fails at ring creation (OOM-killed by its own "
                         "cgroup, or ENOMEM), never later and never anyone else; the daemon serves on", observed,
                         passed)


def test_state_dir_full_then_read_only(request, matrix, tmp_path, small_fs, stream, children, signing_key):
    import fault_models
    key = signing_key[0]
    state = small_fs("64k", "state")
    state_file = os.path.join(state, "model-versions.json")
    with open(state_file, "w") as f:
        json.dump({"fault-checksum": {"highest": "0.9.0"}}, f)
    original = open(state_file, "rb").read()
    _fill(state)
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, state_dir=state)
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
    poll(lambda: (read_stats(stats).get("models", {}).get("default") or {}).get("version") == "1.0.1"
         and read_stats(stats).get("state_write_failures", 0) > failures_before, 20)
    st = read_stats(stats)
    ro_serving = (st.get("models", {}).get("default") or {}).get("version") == "1.0.1" and open(state_file, "rb").read() == after_retry
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


def _first_stream_served(children, tmp_path, signing_key, stream, c_producer, extra):
    """The daemon with `extra` streams configured, and its first stream already being served."""
    proc, stats, _ = fault_daemon(children, tmp_path, signing_key, stream, extra_streams=extra)
    read_line(children.spawn([c_producer, stream, "64", "48", "--fps", "50", "--socket", proc.ingress]))
    reader = results(proc, stream)
    wait_for(lambda: drain(reader), 20, "the first stream to be served")
    return proc, stats, reader


def _limit(pid: int, resource: str, value: int | str) -> None:
    """Sets the soft limit only: raising it again needs no privilege."""
    subprocess.run(["prlimit", "--pid", str(pid), f"--{resource}={value}:"], check=True)


def test_fd_limit_reached_while_streams_attach(request, matrix, tmp_path, stream, children, c_producer,
                                               signing_key):
    """RLIMIT_NOFILE lowered to what the running daemon has open: the cameras that
    connect then cannot be accepted (accept: EMFILE; each also brings a ring fd) and
    wait, connected to the backlog; the daemon logs and counts it; the attached
    stream is served throughout; once the limit is raised they are accepted and
    served by themselves, without a restart on either side."""
    others = [f"{stream}-{i}" for i in range(3)]
    extra = [{"name": n, "width": 64, "height": 48, "max_age_ms": 60000} for n in others]
    proc, stats, reader = _first_stream_served(children, tmp_path, signing_key, stream, c_producer, extra)
    try:
        open_fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        _limit(proc.pid, "nofile", open_fds)
        limited_at = time.monotonic()
        prods = [children.spawn([c_producer, n, "64", "48", "--fps", "50", "--socket", proc.ingress, "--wait", "1.5"])
                 for n in others]
        outs = [Lines(p) for p in prods]
        waiting = [o.next(10) or "" for o in outs]  # not accepted within --wait: "WAITING <why>"
        served_meanwhile = len(drain(reader))
        _limit(proc.pid, "nofile", 4096)
        limited_s = time.monotonic() - limited_at
        accepted = [o.next(20) or "" for o in outs]
        processed = [lambda n=n: stream_stats(stats, n).get("processed", 0) for n in others]
        poll(lambda: all(p() > 0 for p in processed), 10)
        st = read_stats(stats)
        recovered = sum(st.get("streams", {}).get(n, {}).get("processed", 0) > 0 for n in others)
        counted = sum(v for k, v in st.get("refusals", {}).items() if k.endswith("/accept_failed"))
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        reader.close()
    stop_daemon(proc)
    log = daemon_log(proc)
    said = [x.split(": ", 1)[-1] for x in log.splitlines() if "accept on the ingress socket" in x]
    observed = (f"limit = {open_fds} fds (all in use): {sum(w.startswith('WAITING') for w in waiting)}/{len(others)} "
                f"new cameras waiting, not accepted; log: {said[0][-70:] if said else 'nothing'!r} ({len(said)} "
                f"lines), counted {counted} times in {limited_s:.1f} s (retried, not spun on); first stream served "
                f"{served_meanwhile} results meanwhile; after "
                f"raising the limit {sum(a == 'CONNECTED accepted=1' for a in accepted)}/{len(others)} accepted, "
                f"{recovered}/{len(others)} served; healthy {alive}")
    passed = (all(w.startswith("WAITING") for w in waiting) and said and "Too many open files" in said[0]
              and 0 < counted <= 20 * limited_s + 5 and served_meanwhile > 0
              and all(a == "CONNECTED accepted=1" for a in accepted)
              and recovered == len(others) and alive)
    assert matrix.record(request, "resource", "open-file limit reached (RLIMIT_NOFILE = fds in use)", len(others),
                         "new cameras not accepted, the reason logged and counted, others served, recovery "
                         "without restart", observed, passed)


def test_address_space_limit_reached_by_a_big_ring(request, matrix, tmp_path, stream, children, c_producer,
                                                   signing_key):
    """RLIMIT_AS lowered to the daemon's size + 64 MiB; a camera hands over a 4K ring
    (8 slots, ~200 MB) that the daemon cannot map: refused at the handshake with the
    reason (the camera hears it and retries with backoff); the other stream is
    served; raising the limit lets it in at its next attempt."""
    big = stream + "-4k"
    extra = [{"name": big, "max_age_ms": 60000}]
    proc, stats, reader = _first_stream_served(children, tmp_path, signing_key, stream, c_producer, extra)
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            vm_kib = next(int(x.split()[1]) for x in f if x.startswith("VmSize:"))
        _limit(proc.pid, "as", (vm_kib + 64 * 1024) * 1024)
        prod = children.spawn([c_producer, big, "3840", "2160", "--slots", "8", "--fps", "2", "--socket",
                               proc.ingress, "--wait", "1.5"])
        out = Lines(prod)
        heard = out.next(10) or ""  # "WAITING edgeinferd: ...: mmap ...: Cannot allocate memory"
        poll(lambda: stream_stats(stats, big).get("refused"), 5)
        st = read_stats(stats)
        refused = st.get("streams", {}).get(big, {}).get("refused") or {}
        served_meanwhile = len(drain(reader))
        still_alive = proc.poll() is None and st.get("loop_alive")
        _limit(proc.pid, "as", "unlimited")
        accepted = out.next(20) or ""  # the producer's next attempt (backoff at most 5 s)
        attached = poll(lambda: stream_stats(stats, big).get("connected"), 15)
        alive = http_status(proc.metrics_url + "/healthz") == 200
    finally:
        reader.close()
    stop_daemon(proc)
    log = daemon_log(proc)
    logged = any("producer refused:" in x and "Cannot allocate memory" in x for x in log.splitlines())
    observed = (f"limit VmSize+64 MiB: 4K ring refused, the camera heard {heard[-90:]!r}; counted {refused}, logged "
                f"{logged}; first stream served {served_meanwhile} results meanwhile, loop alive {still_alive}; "
                f"limit lifted: {accepted!r}, attached {attached}; healthy {alive}")
    passed = ("Cannot allocate memory" in heard and sum(refused.values()) >= 1 and logged and served_meanwhile > 0
              and still_alive and accepted == "CONNECTED accepted=1" and attached and alive)
    assert matrix.record(request, "resource", "address-space limit (RLIMIT_AS) reached by a new camera's ring", 1,
                         "that camera refused with the reason, the rest served, recovery without restart", observed,
                         passed)
