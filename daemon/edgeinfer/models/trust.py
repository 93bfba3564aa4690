"""The trust store and its keys: what verification trusts (TrustStore: public keys and CA certificates that
only root or the daemon's user could have put there), a new key pair (generate_keys), and installing a
public key in a store (copy_trust). SignatureError, raised for every refusal, is defined here.

verify.py verifies bundles against a TrustStore and re-exports these names.
"""
from __future__ import annotations

import errno
import os
import pathlib
import stat

from edgeinfer.models.bundle import BundleError


class SignatureError(BundleError):
    """A bundle refused by signature verification; the message says which file and why."""


TRUST_ENTRY_MAX = 1 << 20  # a public key or a CA certificate is a few KiB
_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _unsafe(st: os.stat_result, what: str) -> str | None:
    """Why a trust-store entry or directory with this stat could have been written
    by someone other than root or the daemon's user; None if it could not."""
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        return f"{what} owned by uid {st.st_uid}, not root or the daemon's user (uid {euid})"
    if st.st_mode & _GROUP_OR_OTHER_WRITE:
        return f"{what} mode 0o{st.st_mode & 0o7777:o} is writable by group or others"
    return None


class TrustStore:
    """The public keys (PEM `BEGIN PUBLIC KEY`) and CA certificates (PEM `BEGIN
    CERTIFICATE`) in a directory, e.g. /etc/edgeinfer/trust/. CA certificates
    that are expired or not yet valid are not trusted.

    Only what root or the daemon's user alone could have put there is trusted: a
    directory owned by anyone else or writable by group or others refuses the
    whole store (anyone could add a key); an entry that is a symbolic link, owned
    by anyone else or writable by group or others is refused on its own, and
    named with its reason in `refused` (logged by the callers, and part of every
    "not signed by a trusted key" refusal). The bytes checked here are the bytes
    verification uses (`pem`): the files are not opened again."""

    def __init__(self, directory: str):
        self.directory = directory
        self.keys: list[str] = []
        self.cas: list[str] = []
        self.pem: dict[str, bytes] = {}   # path → the bytes read from it
        self.refused: list[str] = []      # "PATH: reason" of each entry not trusted
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise SignatureError(f"{directory}: trust store unreadable ({e.strerror}): every bundle is refused") \
                from None
        try:
            problem = _unsafe(os.fstat(dfd), "directory")  # the directory read is the one checked
            if problem:
                raise SignatureError(f"{directory}: trust store {problem}: anyone who can write there could add a "
                                     "key; every bundle is refused")
            for name in sorted(os.listdir(dfd)):
                self._add(dfd, name)
        finally:
            os.close(dfd)
        if not self.keys and not self.cas:
            raise SignatureError(f"{directory}: no public keys or CA certificates in the trust store: "
                                 "every bundle is refused" + (f" (refused: {'; '.join(self.refused)})"
                                                              if self.refused else ""))

    def _add(self, dfd: int, name: str) -> None:
        path = os.path.join(self.directory, name)
        try:  # O_NOFOLLOW, then fstat of the fd: what is checked is what is read
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                self.refused.append(f"{path}: a symbolic link; trust-store entries must be regular files")
            return  # vanished, or a socket: not an entry
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a directory's fd with a bare errno
            os.close(fd)
            return  # a subdirectory or a FIFO: not an entry
        with os.fdopen(fd, "rb") as f:
            problem = _unsafe(st, "file")
            if problem is None and st.st_size > TRUST_ENTRY_MAX:
                problem = f"{st.st_size} bytes, larger than a key or certificate ({TRUST_ENTRY_MAX} bytes)"
            if problem:
                self.refused.append(f"{path}: {problem}")
                return
            data = f.read(TRUST_ENTRY_MAX)
        if b"BEGIN PUBLIC KEY" in data:
            self.keys.append(path)
        elif b"BEGIN CERTIFICATE" in data and _currently_valid_pem(data):
            self.cas.append(path)
        else:
            return
        self.pem[path] = data

    def private_copies(self, paths: list[str], tmp: str) -> list[pathlib.Path]:
        """The bytes read from `paths`, written to files in the private directory `tmp` for model-signing."""
        out = []
        for i, path in enumerate(paths):
            copy = pathlib.Path(tmp) / f"trust-{i}.pem"
            copy.write_bytes(self.pem[path])
            out.append(copy)
        return out


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


def copy_trust(pub_path: str, trust_dir: str) -> str:
    """Installs a public key in a trust store with modes the store accepts (whatever the umask)."""
    os.makedirs(trust_dir, mode=0o755, exist_ok=True)
    dest = os.path.join(trust_dir, os.path.basename(pub_path))
    with open(pub_path, "rb") as src:
        data = src.read()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return dest
