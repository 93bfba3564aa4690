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

This module verifies (load_verified_bundle, the only loader the daemon uses). The trust store and keys
(trust.py) and signing (sign.py) have modules of their own; their names are re-exported here.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile

from edgeinfer.models import signinglib
from edgeinfer.models.bundle import SIG_FILE, Bundle, OpenBundle, SizeLimits, parse_bundle
from edgeinfer.models.sign import self_sign, sign_bundle, throwaway_signed_copy  # noqa: F401  (re-exported)
from edgeinfer.models.trust import (  # noqa: F401  (re-exported: importers name them from here)
    TRUST_ENTRY_MAX,
    SignatureError,
    TrustStore,
    _validity_problem,
    copy_trust,
    generate_keys,
)


@dataclasses.dataclass(frozen=True)
class Signer:
    key_file: str      # the trust-store file that verified the bundle
    fingerprint: str   # sha256 of the public key (DER), hex


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


def _fingerprint(pub_pem: bytes) -> str:
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_public_key(pub_pem)
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


def _mismatch(e: ValueError) -> bool:
    """model-signing's ValueError after the signature itself verified: the files are not what was signed."""
    return "Signature mismatch" in str(e)


def _find_signer(path: str, sig: bytes, trust: TrustStore, tmp: str):
    """Which trust anchor made the signature `sig`, before any other file matters: returns
    (a function making a fresh verifying config for it, the Signer); raises SignatureError.
    Each anchor verifies the signature against an empty directory, so no file of the
    bundle is needed: a signature it made reports a mismatch of the files, any other an error."""
    model_signing = signinglib.model_signing()

    sig_path = os.path.join(path, SIG_FILE)
    sig_copy = pathlib.Path(tmp) / SIG_FILE
    sig_copy.write_bytes(sig)
    empty = pathlib.Path(tmp) / "empty"
    empty.mkdir(mode=0o700, exist_ok=True)

    def made_by(make) -> bool:
        try:
            make().verify(empty, sig_copy)
        except ValueError as e:
            return _mismatch(e)
        except Exception:  # malformed, or another signer: this trust anchor did not sign it
            return False
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
                                 f"{trust.directory} has no valid CA certificates{_refused_note(trust)}")
        cas = trust.private_copies(trust.cas, tmp)

        def make_cert():
            return model_signing.verifying.Config().use_certificate_verifier(certificate_chain=cas)
        if made_by(make_cert):
            leaf = certs[0]
            from cryptography.hazmat.primitives import hashes
            return make_cert, Signer(f"certificate '{leaf.subject.rfc4514_string()}'",
                                     leaf.fingerprint(hashes.SHA256()).hex())
        raise SignatureError(f"{sig_path}: certificate '{certs[0].subject.rfc4514_string()}' does not chain to a "
                             f"trusted CA in {trust.directory}{_refused_note(trust)}")
    tried = []
    for key, copy in zip(trust.keys, trust.private_copies(trust.keys, tmp)):
        def make_key(copy=copy):
            return model_signing.verifying.Config().use_elliptic_key_verifier(public_key=copy)
        if made_by(make_key):
            return make_key, Signer(key, _fingerprint(trust.pem[key]))
        tried.append(os.path.basename(key))
    raise SignatureError(f"{sig_path}: not signed by a trusted key (tried {', '.join(tried) or 'no keys'} in "
                         f"{trust.directory}){_refused_note(trust)}")


def _refused_note(trust: TrustStore) -> str:
    return f"; not trusted: {'; '.join(trust.refused)}" if trust.refused else ""


def _signature_of(path: str, sig: bytes | None) -> bytes:
    if sig is None:
        raise SignatureError(f"{os.path.join(path, SIG_FILE)}: missing: the bundle is not signed")
    return sig


def check_signer(path: str, sig: bytes | None, trust: TrustStore) -> Signer:
    """Refuses a bundle whose signature (`sig`, None: no model.sig) no trust anchor made,
    from the signature alone: an unsigned or foreign model.onnx is refused before it is read."""
    sig = _signature_of(path, sig)
    _signed_resources(sig, os.path.join(path, SIG_FILE))
    with tempfile.TemporaryDirectory(prefix="edgeinfer-verify-") as tmp:
        return _find_signer(path, sig, trust, tmp)[1]


def verify_files(path: str, files: dict[str, bytes], trust: TrustStore) -> Signer:
    """Verifies the in-memory bundle `files` (as read from `path`) against the trust store."""
    sig_path = os.path.join(path, SIG_FILE)
    sig = _signature_of(path, files.get(SIG_FILE))
    signed = _signed_resources(sig, sig_path)
    # A private copy of exactly the bytes we hold: model-signing reads files, and
    # the bundle on disk may change between our read and its read.
    with tempfile.TemporaryDirectory(prefix="edgeinfer-verify-") as tmp:
        make, signer = _find_signer(path, sig, trust, tmp)
        model_dir = pathlib.Path(tmp) / "bundle" / (os.path.basename(os.path.normpath(path)) or "bundle")
        model_dir.mkdir(mode=0o700, parents=True)
        for name, data in files.items():
            if name != SIG_FILE:
                (model_dir / name).write_bytes(data)
        try:
            make().verify(model_dir, pathlib.Path(tmp) / SIG_FILE)
        except ValueError as e:
            if _mismatch(e):  # the trusted signer made this signature, but the files are not what it signed
                raise SignatureError(_explain_mismatch(path, files, signed)) from None
            raise SignatureError(f"{sig_path}: signature does not match the bundle ({e})") from None
        except Exception as e:  # fail closed, with the file named, whatever model-signing raised
            raise SignatureError(f"{sig_path}: signature does not match the bundle ({type(e).__name__}: {e})") \
                from None
        # model-signing ignores some paths (.git*, model.sig); a bundle may hold nothing unsigned.
        extra = sorted(n for n in files if n != SIG_FILE and n not in signed)
        if extra:
            raise SignatureError(f"{os.path.join(path, extra[0])}: not covered by the signature "
                                 "(a file was added to the signed bundle)")
        return signer


def load_verified_bundle(path: str, trust: TrustStore, limits: SizeLimits = SizeLimits()) -> tuple[Bundle, Signer]:
    """THE loader for anything that will run: check every file's size before any
    is read, refuse a signature no trust anchor made before the model is read,
    read every file once, verify the signature on those bytes, only then parse them."""
    with OpenBundle(path, limits) as opened:
        check_signer(path, opened.read(SIG_FILE) if SIG_FILE in opened.sizes else None, trust)
        files = opened.read_all()
    signer = verify_files(path, files, trust)
    return parse_bundle(path, files), signer
