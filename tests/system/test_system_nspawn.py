"""System tests in a booted systemd: the real .deb installed with apt in a
debootstrapped Debian 12 container run by systemd-nspawn (PID 1 here is not
systemd). The checks run inside (tests/system/inside.sh); this test prepares
the container, boots it, and asserts each check's line: a fresh install, the
socket unit, real users refused or served, restarts and kills with the fd store
(the gap a reader sees, in ms), the network gateway's unit serving tritonclient
across a daemon restart and its own SIGKILL, the MQTT bridge's unit publishing
to Debian's Mosquitto, an upgrade to a newer build with a camera running, and an
upgrade from 0.1.0 built from its commit.

The rootfs and the 0.1.0 package are built once into a cache outside the clone
($EDGEINFER_CACHE, default ~/.cache/edgeinfer) by tests/system/prepare, which
`make test` runs before pytest: a first run's ~2 min debootstrap and ~4-7 min
package build are not inside any test's timeout.
"""
from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import tarfile
import uuid

import pytest

from conftest import ROOT, built_deb, compile_c, require_tool
from daemon_helpers import bundle, sign_copy
from test_rtsp import RtspServer, _gst_rtsp_missing

# The cache of what the container needs besides the new .deb (tests/system/prepare, run by `make test` before pytest).
CACHE = os.environ.get("EDGEINFER_CACHE",
                       os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "edgeinfer"))

CHECKS = ["install", "user_and_group", "units_enabled", "gateway_shipped_disabled", "mqtt_shipped_disabled",
          "no_bundle_no_crash_loop", "first_run_self_sign", "verify_unit", "gateway_verify_unit", "mqtt_verify_unit",
          "start", "sockets",
          "loop_is_fifo", "loop_affinity", "results_from_group_member", "results_with_labels",
          "impersonation_refused", "outsider_refused", "reader_not_allowed", "linger_no_watchdog_restart",
          "reload", "fdstore_restart",
          "fdstore_kill", "fdstore_accounting", "daemon_sigkill_restart", "lane_restarted_by_daemon", "watchdog_restart",
          "socket_activation", "allow_downgrade_as_root", "refused_reload_then_restart", "camera_add", "camera_unit",
          "camera_stalled_source",
          "camera_rtsp_sender_clock", "camera_rtsp_package", "camera_restarts_100", "camera_stop", "camera_add_as_told",
          "gateway_serves", "gateway_daemon_restart", "gateway_restart_codes", "gateway_sigkill_restart",
          "gateway_sandbox_zmq", "gateway_memory_bounded",
          "mqtt_publishes", "upgrade_keeps_cameras", "gateway_after_upgrade", "stop", "purge", "purge_cameras",
          "purge_gateway", "purge_mqtt",
          # issue 35: a fresh install again, as an operator follows docs/operations.md
          "several_models_start", "condition_follows_config", "provider_openvino", "frigate_socket_group", "start_file_gateway_tls_key",
          "start_file_mqtt_password", "start_file_camera", "start_file_daemon_config", "remove_no_dangling_links",
          "purge_reowns_operator_files",
          "upgrade_from_0_1"]


def free_ports(n: int) -> list[int]:
    """n TCP ports free on this host's loopback now: its broker's listeners (free in the container's own network
    namespace too, which starts empty)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def prepared() -> dict[str, str]:
    """The rootfs and 0.1.0's package from the cache (tests/system/prepare: `make test` builds them before pytest;
    here it is a no-op, or the first build when this file is run alone)."""
    require_tool("debootstrap")
    r = subprocess.run([str(ROOT / "tests/system/prepare")], capture_output=True, text=True, timeout=2400,
                       env={**os.environ, "EDGEINFER_CACHE": CACHE})
    if r.returncode != 0:
        pytest.fail(f"tests/system/prepare failed: {r.stderr[-1500:]}")
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def rootfs_tree(tar: str) -> str | None:
    """The rootfs tarball unpacked once, beside it in the cache: the read-only lower layer of each run's root
    (an overlay), instead of 900 MB unpacked into every run and removed after it. None where it cannot be made."""
    tree = tar.removesuffix(".tar") + ".tree"
    if not os.path.isfile(os.path.join(tree, ".unpacked")):
        part = tree + ".part"
        shutil.rmtree(part, ignore_errors=True)
        os.mkdir(part)
        r = subprocess.run(["tar", "-C", part, "-xf", tar], capture_output=True, timeout=600)
        if r.returncode != 0:
            shutil.rmtree(part, ignore_errors=True)
            return None
        open(os.path.join(part, ".unpacked"), "w").close()
        shutil.rmtree(tree, ignore_errors=True)
        os.rename(part, tree)
    return tree


def mount_root(tar: str, work) -> tuple[object, list]:
    """The container's root: an overlay of the cached tree (rootfs_tree) and an empty upper layer of this run;
    where overlayfs is not to be had, the tarball unpacked as before. (root, what to unmount at the end)."""
    root = work / "root"
    root.mkdir()
    tree = rootfs_tree(tar)
    if tree:
        upper, scratch = work / "upper", work / "overlay-work"
        upper.mkdir()
        scratch.mkdir()
        r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={tree},upperdir={upper},workdir={scratch}", str(root)],
                           capture_output=True, timeout=60)
        if r.returncode == 0:
            return root, [root]
    subprocess.run(["tar", "-C", str(root), "-xf", tar], check=True, timeout=300)
    return root, []


def _ar_members(path: str) -> list[tuple[str, bytes]]:
    """The members of an ar archive (a .deb: debian-binary, control.tar.*, data.tar.*), in order."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"!<arch>\n", path
    members, at = [], 8
    while at < len(data):
        header = data[at:at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        members.append((name, data[at + 60:at + 60 + size]))
        at += 60 + size + (size & 1)
    return members


def _ar_write(path, members: list[tuple[str, bytes]]) -> None:
    with open(path, "wb") as f:
        f.write(b"!<arch>\n")
        for name, body in members:
            f.write(f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode())
            f.write(body + (b"\n" if len(body) & 1 else b""))


def next_version(deb: str, out) -> str:
    """The same package under a higher version (the upgrade of a running install to a newer build). Only the
    control member is rewritten (its `Version:`); the data member is the built one, byte for byte: no 400 MB
    unpacked and packed again (8-25 s of the fixture, in the test's timeout)."""
    members = _ar_members(deb)
    i = next(i for i, (name, _) in enumerate(members) if name.startswith("control.tar"))
    with tarfile.open(fileobj=io.BytesIO(members[i][1])) as src:
        entries = [(m, src.extractfile(m).read() if m.isfile() else None) for m in src.getmembers()]
    control = io.BytesIO()
    with tarfile.open(fileobj=control, mode="w:gz", format=tarfile.GNU_FORMAT) as dst:
        for m, body in entries:
            if m.name in ("./control", "control"):
                text = body.decode()
                version = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))
                # (and edgeinfer-rtsp's Depends: edgeinfer (= VERSION), so that the two upgrade together)
                body = text.replace(f"Version: {version}", f"Version: {version}+test1").replace(
                    f"(= {version})", f"(= {version}+test1)").encode()
                m.size = len(body)
            dst.addfile(m, io.BytesIO(body) if body is not None else None)
    members[i] = ("control.tar.gz", control.getvalue())
    _ar_write(out, members)
    return str(out)


# The fixture's boot runs inside its first test's timeout: minutes of checks (and, when this file runs alone on a
# machine that never ran it, the first build of the cache).
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module")
def system_run(tmp_path_factory, signing_key):
    if os.geteuid() != 0:
        pytest.skip("system tests boot a container: they need root")
    nspawn = require_tool("systemd-nspawn")
    deb = built_deb()
    work = tmp_path_factory.mktemp("nspawn")
    test, out = work / "test", work / "out"
    for d in (test, out):
        d.mkdir()
    built = prepared()
    root, mounted = mount_root(built["rootfs"], work)
    try:
        return _boot(nspawn, deb, built, root, test, out, signing_key)
    finally:
        for m in mounted:
            subprocess.run(["umount", str(m)], timeout=120)
        for d in (root, work / "upper", work / "overlay-work"):
            shutil.rmtree(d, ignore_errors=True)


def run_at_boot(root, name: str, script: str, timeout_s: int) -> None:
    """The container's oneshot unit NAME that runs /test/SCRIPT once it has booted (its checks), and Debian's
    Mosquitto kept from starting at boot (the scripts start it on the ports they were given)."""
    for link in (root / "etc/systemd/system").glob("*.wants/mosquitto.service"):
        link.unlink()
    unit = root / f"etc/systemd/system/{name}.service"
    unit.write_text(f"[Unit]\nDescription=edgeinfer {name}\nAfter=basic.target network.target\n\n[Service]\n"
                    f"Type=oneshot\nExecStart=/test/{script}\nStandardOutput=journal+console\n"
                    f"TimeoutStartSec={timeout_s}\n")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    os.symlink(f"/etc/systemd/system/{name}.service", wants / f"{name}.service")


class NetworkNamespace:
    """A network namespace of the container's own (`ip netns`: its loopback only), so that what the container
    serves on the package's fixed ports (9464, 8001, ...) never meets what this host's tests serve meanwhile
    (`make test` runs the system tests beside the others), and the container reaches no archive: the package's
    dependencies come from the rootfs, as on a host without a mirror. Deleted by close()."""

    def __init__(self):
        self.name = f"eit-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, timeout=30)
        try:
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, capture_output=True,
                           timeout=30)
        except BaseException:
            self.close()
            raise
        self.path = f"/run/netns/{self.name}"

    def close(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, timeout=30)


def boot_container(nspawn: str, root, test, out, timeout_s: int, netns: str) -> subprocess.CompletedProcess:
    """Boots the container (systemd as its PID 1) with /test (read-only) and /out bound, in the network namespace
    netns (a path: NetworkNamespace.path); returns when it powered off."""
    return subprocess.run([nspawn, "-q", "--boot", "-D", str(root), "--register=no", "--keep-unit",
                           "--console=pipe", f"--bind={out}:/out", f"--bind-ro={test}:/test",
                           f"--network-namespace-path={netns}"],
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                          env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"})


def _boot(nspawn, deb, built, root, test, out, signing_key):
    """The container set up (the package and the checks' files in /test), booted, its checks run to the end:
    (results.txt, the other files it wrote, the nspawn run)."""
    shutil.copy(deb, test / "edgeinfer.deb")
    next_version(deb, test / "edgeinfer-next.deb")
    rtsp_deb = built_deb("edgeinfer-rtsp")  # PyAV, for the RTSP camera (decision record 0036)
    shutil.copy(rtsp_deb, test / "edgeinfer-rtsp.deb")
    next_version(rtsp_deb, test / "edgeinfer-rtsp-next.deb")
    shutil.copy(built_deb("edgeinfer-openvino"), test / "edgeinfer-openvino.deb")  # decision record 0038
    old = built.get("release_0_1")
    if old:
        shutil.copy(old, test / "edgeinfer-0.1.0.deb")
    for f in ("inside.sh", "checks.sh", "gap.py"):
        shutil.copy(ROOT / "tests/system" / f, test / f)
    compile_c(ROOT / "tests/adversary/linger.c", test)  # the linger attack (issue 23, A), run inside as a user
    key, pub, _ = signing_key
    (test / "trust").mkdir()
    shutil.copy(pub, test / "trust" / "release.pub")
    sign_copy("orientation", test / "v1", key)
    sign_copy("detector", test / "det", key)  # the several-models layout and Frigate's front (issue 35)
    shutil.copytree(bundle("orientation"), test / "unsigned")  # what `make models` fetched: `model self-sign` it
    sign_copy("orientation", test / "v2", key, lambda d: (d / "model.yaml").write_text(
        (d / "model.yaml").read_text().replace("version: 0.0.11", "version: 0.0.12")))
    # Users cam, cam2, reader, outsider are created inside before the daemon starts (names resolve at load).
    (test / "edgeinferd.yaml").write_text(
        "model:\n  bundle: /var/lib/edgeinfer/models/current\n  watch_interval_s: 0\n"
        "streams:\n  - name: cam0\n    producer: {user: cam}\n    readers: {groups: [edgeinfer]}\n"
        "    width: 224\n    height: 224\n"
        "  - name: cam1\n    producer: {user: cam2}\n    readers: {users: [cam2]}\n"
        # Cameras as services: their users are made by `edgeinferctl camera add` inside, before the start.
        "  - name: gate1\n    producer: {user: edgeinfer-cam-gate1}\n    readers: {groups: [edgeinfer]}\n"
        "    width: 224\n    height: 224\n"
        "  - name: door\n    producer: {user: edgeinfer-cam-door}\n    readers: {groups: [edgeinfer]}\n"
        "  - name: lobby\n    producer: {user: edgeinfer-cam-lobby}\n    readers: {groups: [edgeinfer]}\n"
        "    width: 224\n    height: 224\n"
        "lanes: [{cpus: [0]}, {cpus: [1]}]\n"
        # handovers: camera_restarts_100 hands gate1's ring over 100 times in about a minute (30 by default).
        "runtime:\n  scheduling: fifo\n  fault_injection: true\n  lane_hang_s: 1\n  lane_restarts: 2\n"
        "  handovers: 1000\n"
        "metrics:\n  ready_requires_stream: false\n")
    run_at_boot(root, "edgeinfer-systemtest", "inside.sh", 1500)  # inside.sh starts Mosquitto on /test/mqtt-ports
    # The RTSP camera's server runs here, in the container's network namespace: GStreamer is not in the
    # container, and the camera unit needs nothing but a server to reach.
    missing = _gst_rtsp_missing()
    if missing:
        pytest.fail(missing)
    netns = NetworkNamespace()
    try:
        rtsp = RtspServer(netns=netns.name)  # in the container's namespace: its camera unit reaches it there
        try:
            (test / "rtsp-port").write_text(str(rtsp.port))
            (test / "mqtt-ports").write_text(" ".join(map(str, free_ports(2))))
            boot = boot_container(nspawn, root, test, out, 1800, netns.path)
        finally:
            rtsp.close()
    finally:
        netns.close()
    results = (out / "results.txt").read_text() if (out / "results.txt").exists() else ""
    # Every check's line (its figures: gaps, codes, counts) kept after the run, beside the .deb (build/ is ignored).
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build/system-results.txt").write_text(results)
    extra = {name: (out / name).read_text() if (out / name).exists() else "" for name in ("journal.txt",
                                                                                       "security.txt",
                                                                                       "camera-security.txt",
                                                                                       "gateway-security.txt",
                                                                                       "gateway-journal.txt",
                                                                                       "mqtt-security.txt",
                                                                                       "mqtt-journal.txt")}
    return results, extra, boot


def test_container_ran_every_check(system_run):
    results, extra, boot = system_run
    assert results.rstrip().endswith("DONE"), f"the checks did not finish:\n{results}\n{boot.stdout[-3000:]}"


@pytest.mark.parametrize("check", CHECKS)
def test_system_check(system_run, check):
    results, extra, _ = system_run
    line = next((x for x in results.splitlines() if x.split(" ", 2)[1:2] == [check]), None)
    assert line is not None, f"{check} did not run:\n{results}"
    if line.startswith("SKIP"):  # the container's host lacks what the check needs (checks.sh: exit 77)
        pytest.skip(line)
    journal = extra["gateway-journal.txt" if check.startswith("gateway_") else
                    "mqtt-journal.txt" if check.startswith("mqtt_") else "journal.txt"]
    assert line.startswith("PASS"), f"{line}\n--- journal ---\n{journal[-4000:]}"


@pytest.mark.parametrize("report, unit", [("security.txt", "edgeinferd.service"),
                                          ("camera-security.txt", "edgeinfer-camera@gate1.service"),
                                          ("gateway-security.txt", "edgeinfer-gateway.service"),
                                          ("mqtt-security.txt", "edgeinfer-mqtt.service")])
def test_security_exposure_printed_and_within_target(system_run, report, unit):
    _, extra, _ = system_run
    sec = extra[report]
    print(sec[-600:])
    line = next((x for x in sec.splitlines() if "Overall exposure level" in x), None)
    assert line is not None, sec[-2000:]
    exposure = float(line.split(f"level for {unit}:")[1].split()[0])
    assert exposure <= 2.5, line


def test_reliability_rows_from_the_container(system_run, matrix, request):
    """The container's fault checks as rows of the reliability matrix."""
    results, _, _ = system_run
    lines = {x.split(" ", 2)[1]: x for x in results.splitlines() if len(x.split(" ", 2)) > 1}
    rows = [("fdstore_restart", "daemon", "`systemctl restart` under load, 3 times (booted systemd, fd store)", 3,
             "the camera never reconnects; results resume by themselves; the gap a reader sees, in ms"),
            ("fdstore_kill", "daemon", "SIGKILL under load, 3 times; systemd restarts it (fd store)", 3,
             "the camera never reconnects; results resume by themselves; the gap a reader sees, in ms"),
            ("daemon_sigkill_restart", "daemon", "SIGKILL under load, systemd as supervisor (Restart=on-failure)", 3,
             "systemd restarts it; results resume; producer untouched"),
            ("lane_restarted_by_daemon", "daemon", "a lane SIGKILLed (booted systemd, 2 lanes)", 1,
             "the daemon restarts the lane, counted; results go on; systemd restarts nothing"),
            ("watchdog_restart", "daemon", "a lane's recovery fails (killed beyond runtime.lane_restarts)", 1,
             "WATCHDOG=1 stops; systemd kills and restarts the daemon"),
            ("socket_activation", "daemon", "`systemctl stop` with a camera running (the socket unit stays)", 1,
             "the camera reconnects; the socket unit starts the daemon for it; served"),
            ("allow_downgrade_as_root", "daemon", "`edgeinferctl model allow-downgrade` run as root (as the refusal "
             "says), then `systemctl restart`", 1, "the state file stays edgeinfer:edgeinfer 0600; active, serving "
             "the allowed version"),
            ("refused_reload_then_restart", "daemon", "`current` flipped to an unsigned bundle, `systemctl reload` "
             "(refused), then `systemctl restart`", 1, "active on the last known-good version, said in the journal, "
             "STATUS=, /healthz and the metric; a reload onto a good bundle ends it"),
            ("upgrade_keeps_cameras", "daemon", "apt upgrade to a newer build with a camera running", 1,
             "one restart; config and state kept; the camera never reconnects; results resume"),
            ("upgrade_from_0_1", "daemon", "apt upgrade from 0.1.0 (ABI 1), an edited config kept", 1,
             "config and state kept; its stream without a producer refused (apt's output and the journal say "
             "why, the daemon does not start); once the producer is named, an ABI 2 camera served"),
            ("gateway_daemon_restart", "gateway", "`systemctl restart edgeinferd` under a serving gateway (booted "
             "systemd, tritonclient ModelInfer)", 1, "its rings reconnect by themselves; ModelInfer answered again "
             "within 60 s; the gateway unit is not restarted (NRestarts 0)"),
            ("gateway_sigkill_restart", "gateway", "SIGKILL of edgeinfer-gateway (`systemctl kill -s KILL`)", 1,
             "systemd restarts it (Restart=on-failure, NRestarts +1); READY again; ModelInfer answered again"),
            ("camera_restarts_100", "camera", "a camera unit (edgeinfer-camera@) stopped and started 100 times "
             "(booted systemd)", 100, "every start READY; the daemon serves on; its fds and memory do not grow"),
            ("camera_stalled_source", "camera", "a camera unit whose RTSP server accepts and never answers", 1,
             "never READY; the start times out and systemd restarts it; the reason in the journal"),
            ("impersonation_refused", "isolation", "a camera user produces another camera's stream (booted systemd)",
             1, "refused with the reason"),
            ("outsider_refused", "isolation", "a user outside group edgeinfer (booted systemd, real users)", 1,
             "permission denied on both sockets: nothing served"),
            ("reader_not_allowed", "isolation", "a reader outside the stream's readers (booted systemd)", 1,
             "refused with the reason"),
            ("mqtt_publishes", "isolation", "edgeinfer-mqtt.service (the unit from the .deb) lists a stream whose "
             "readers do not allow its user, beside one whose readers do (booted systemd, Debian's Mosquitto)", 1,
             "the first refused by edgeinferd, said in the journal; the other's results published; NRestarts 0")]
    ok = True
    for check, area, fault, n, expected in rows:
        line = lines.get(check, f"MISSING {check}")
        ok &= matrix.record(request, area, fault, n, expected, line.split(" ", 2)[-1][:300] or "-",
                            line.startswith("PASS"))
    assert ok


@pytest.mark.parametrize("script", ["inside.sh", "upgrade.sh", "checks.sh"])
def test_the_container_scripts_parse(script):
    """The container scripts run only in a booted container, minutes in: a quoting slip there ends every later check
    at once (bash reads a script as it goes), so each is parsed here first."""
    r = subprocess.run(["bash", "-n", str(ROOT / "tests/system" / script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
