"""Signed model bundles: OpenSSF Model Signing (`model-signing`), fail closed.

A bundle's `model.sig` is a model-signing signature (sigstore bundle, DSSE
envelope, in-toto statement listing every file's sha256) made with an
elliptic-curve key (P-256/P-384). Verification runs fully offline against the
public keys in the trust store, on a private copy of the bytes the daemon has
already read into memory: what was verified is exactly what gets parsed and
loaded, whatever happens to the files on disk meanwhile.

Every refusal names the file and the reason. Interoperable both ways with the
stock `model_signing` CLI (`model_signing sign key BUNDLE --private_key K
--signature BUNDLE/model.sig`).
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile

from edgeinfer.bundle import MODEL_FILE, Bundle, BundleError, parse_bundle, read_bundle_files

SIG_FILE = "model.sig"


class SignatureError(BundleError):
    """A bundle refused by signature verification; the message says which file and why."""


@dataclasses.dataclass(frozen=True)
class Signer:
    key_file: str      # the trust-store file that verified the bundle
    fingerprint: str   # sha256 of the public key (DER), hex


class TrustStore:
    """The public keys (PEM `BEGIN PUBLIC KEY`) and CA certificates (PEM `BEGIN
    CERTIFICATE`) in a directory, e.g. /etc/edgeinfer/trust/. CA certificates
    that are expired or not yet valid are not trusted."""

    def __init__(self, directory: str):
        self.directory = directory
        try:
            names = sorted(os.listdir(directory))
        except OSError as e:
            raise SignatureError(f"{directory}: trust store unreadable ({e.strerror}): every bundle is refused") \
                from None
        self.keys: list[str] = []
        self.cas: list[str] = []
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read(1 << 20)
            except OSError:
                continue
            if b"BEGIN PUBLIC KEY" in data:
                self.keys.append(path)
            elif b"BEGIN CERTIFICATE" in data and _currently_valid_pem(data):
                self.cas.append(path)
        if not self.keys and not self.cas:
            raise SignatureError(f"{directory}: no public keys or CA certificates in the trust store: "
                                 "every bundle is refused")


def _currently_valid_pem(data: bytes) -> bool:
    from cryptography import x509
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        return False
    return bool(certs) and all(_validity_problem(c) is None for c in certs)


def _validity_problem(cert) -> str | None:
    import datetime
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc < now:
        return f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if cert.not_valid_before_utc > now:
        return f"not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    return None


def _signature_certificates(sig: bytes) -> list:
    """The certificate chain a signature carries (signing certificate first); [] for key signatures."""
    from cryptography import x509
    try:
        chain = json.loads(sig)["verificationMaterial"].get("x509CertificateChain")
    except (ValueError, KeyError, TypeError, AttributeError):
        return []
    if not chain:
        return []
    return [x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"])) for c in chain.get("certificates", [])]


def _fingerprint(pub_pem_path: str) -> str:
    from cryptography.hazmat.primitives import serialization
    with open(pub_pem_path, "rb") as f:
        key = serialization.load_pem_public_key(f.read())
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _signed_resources(sig: bytes, sig_path: str) -> dict[str, str]:
    """name → sha256 of every file the signature lists (only trust this after verification)."""
    try:
        envelope = json.loads(sig)["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"]))
        return {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    except (ValueError, KeyError, TypeError) as e:
        raise SignatureError(f"{sig_path}: not a model-signing signature ({type(e).__name__}: {e})") from None


def _explain_mismatch(path: str, files: dict[str, bytes], signed: dict[str, str]) -> str:
    present = {n for n in files if n != SIG_FILE}
    for name in sorted(present - set(signed)):
        return f"{os.path.join(path, name)}: not covered by the signature (a file was added to the signed bundle)"
    for name in sorted(set(signed) - present):
        return f"{os.path.join(path, name)}: signed, but missing from the bundle"
    for name in sorted(present):
        if hashlib.sha256(files[name]).hexdigest() != signed[name]:
            return f"{os.path.join(path, name)}: content differs from its signed sha256 (tampered or replaced)"
    return f"{os.path.join(path, SIG_FILE)}: signature does not match the bundle"


def verify_files(path: str, files: dict[str, bytes], trust: TrustStore) -> Signer:
    """Verifies the in-memory bundle `files` (as read from `path`) against the trust store."""
    import model_signing

    sig_path = os.path.join(path, SIG_FILE)
    sig = files.get(SIG_FILE)
    if sig is None:
        raise SignatureError(f"{sig_path}: missing: the bundle is not signed")
    signed = _signed_resources(sig, sig_path)
    # A private copy of exactly the bytes we hold: model-signing reads files, and
    # the bundle on disk may change between our read and its read.
    with tempfile.TemporaryDirectory(prefix="edgeinfer-verify-") as tmp:
        model_dir = pathlib.Path(tmp) / (os.path.basename(os.path.normpath(path)) or "bundle")
        model_dir.mkdir(mode=0o700)
        for name, data in files.items():
            if name != SIG_FILE:
                (model_dir / name).write_bytes(data)
        sig_copy = pathlib.Path(tmp) / SIG_FILE
        sig_copy.write_bytes(sig)

        def passes(config) -> bool:
            """True if `config` verifies the copy; raises on a mismatch of the files it signed."""
            try:
                config.verify(model_dir, sig_copy)
            except ValueError as e:
                if "Signature mismatch" in str(e):
                    # The trusted signer made this signature, but the files are not what it signed.
                    raise SignatureError(_explain_mismatch(path, files, signed)) from None
                return False
            except Exception:  # malformed, or another signer: this trust anchor did not sign it
                return False
            # model-signing ignores some paths (.git*, model.sig); a bundle may hold nothing unsigned.
            extra = sorted(n for n in files if n != SIG_FILE and n not in signed)
            if extra:
                raise SignatureError(f"{os.path.join(path, extra[0])}: not covered by the signature "
                                     "(a file was added to the signed bundle)")
            return True

        certs = _signature_certificates(sig)
        if certs:
            # Certificate signature. model-signing checks the chain at the signing certificate's
            # start of validity, so expiry is checked here, against the current time.
            for cert in certs:
                problem = _validity_problem(cert)
                if problem:
                    raise SignatureError(f"{sig_path}: certificate '{cert.subject.rfc4514_string()}' {problem}")
            if not trust.cas:
                raise SignatureError(f"{sig_path}: signed with a certificate, but the trust store "
                                     f"{trust.directory} has no valid CA certificates")
            if passes(model_signing.verifying.Config().use_certificate_verifier(certificate_chain=trust.cas)):
                leaf = certs[0]
                return Signer(f"certificate '{leaf.subject.rfc4514_string()}'",
                              leaf.fingerprint(__import__("cryptography").hazmat.primitives.hashes.SHA256()).hex())
            raise SignatureError(f"{sig_path}: certificate '{certs[0].subject.rfc4514_string()}' does not chain to a "
                                 f"trusted CA in {trust.directory}")
        tried = []
        for key in trust.keys:
            if passes(model_signing.verifying.Config().use_elliptic_key_verifier(public_key=key)):
                return Signer(key, _fingerprint(key))
            tried.append(os.path.basename(key))
    raise SignatureError(f"{sig_path}: not signed by a trusted key (tried {', '.join(tried) or 'no keys'} in "
                         f"{trust.directory})")


def load_verified_bundle(path: str, trust: TrustStore) -> tuple[Bundle, Signer]:
    """THE loader for anything that will run: read every file once, verify the
    signature on those bytes, only then parse them."""
    files = read_bundle_files(path)
    signer = verify_files(path, files, trust)
    return parse_bundle(path, files), signer


def sign_bundle(path: str, private_key: str, certificate: str | None = None, chain: tuple = ()) -> str:
    """Signs every file of the bundle directory into BUNDLE/model.sig (what the
    stock CLI does with --signature BUNDLE/model.sig); with `certificate` (and
    its intermediate `chain`), a certificate signature."""
    import model_signing

    if not os.path.isdir(path):
        raise BundleError(f"{path}: a model bundle is a directory")
    if not os.path.exists(os.path.join(path, MODEL_FILE)):
        raise BundleError(f"{os.path.join(path, MODEL_FILE)}: missing from the bundle")
    sig = os.path.join(path, SIG_FILE)
    hashing = model_signing.hashing.Config().set_ignored_paths(paths=[SIG_FILE], ignore_git_paths=True)
    try:
        config = model_signing.signing.Config()
        if certificate and not chain:
            raise BundleError(f"{certificate}: a certificate signature carries its chain: give the issuing CA "
                              "certificate(s) with --chain")
        if certificate:
            config = config.use_certificate_signer(private_key=private_key, signing_certificate=certificate,
                                                   certificate_chain=list(chain))
        else:
            config = config.use_elliptic_key_signer(private_key=private_key)
        config.set_hashing_config(hashing).sign(pathlib.Path(path), pathlib.Path(sig))
    except (ValueError, TypeError, OSError) as e:
        raise BundleError(f"{private_key}: cannot sign with this key: {e}") from None
    return sig


def generate_keys(out_dir: str, name: str = "edgeinfer", curve: str = "P-256") -> tuple[str, str]:
    """A new EC key pair: NAME.key (0600) and NAME.pub (0644) in out_dir."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    curves = {"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1()}
    if curve not in curves:
        raise ValueError(f"curve {curve!r}: one of {sorted(curves)} (model signing has no Ed25519)")
    os.makedirs(out_dir, exist_ok=True)
    key_path, pub_path = os.path.join(out_dir, f"{name}.key"), os.path.join(out_dir, f"{name}.pub")
    for p in (key_path, pub_path):
        if os.path.exists(p):
            raise FileExistsError(f"{p} exists; refusing to overwrite a key")
    key = ec.generate_private_key(curves[curve])
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(pub)
    return key_path, pub_path


def throwaway_signed_copy(bundle: str, workdir: str, name: str) -> tuple[str, str]:
    """For local runs (demo, benchmarks): a copy of `bundle` in workdir/bundle,
    signed with a new key pair made for it, and a trust store (workdir/trust)
    holding only that key. Returns (signed bundle, trust dir)."""
    key, pub = generate_keys(os.path.join(workdir, "keys"), name)
    trust = os.path.join(workdir, "trust")
    copy_trust(pub, trust)
    signed = os.path.join(workdir, "bundle")
    shutil.copytree(bundle, signed)
    sign_bundle(signed, key)
    return signed, trust


def copy_trust(pub_path: str, trust_dir: str) -> str:
    os.makedirs(trust_dir, exist_ok=True)
    dest = os.path.join(trust_dir, os.path.basename(pub_path))
    shutil.copyfile(pub_path, dest)
    return dest
