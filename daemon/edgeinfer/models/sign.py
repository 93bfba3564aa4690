"""Signing model bundles: sign_bundle() (`edgeinferctl model sign`; what the stock `model_signing sign` CLI
writes), and self_sign() (`edgeinferctl model self-sign`, the demo and benchmarks): a signed copy of an
unsigned bundle with a one-off key, its public half trusted. verify.py verifies what these make and
re-exports them.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from typing import Callable

from edgeinfer.models import signinglib
from edgeinfer.models.bundle import MODEL_FILE, SIG_FILE, BundleError
from edgeinfer.models.trust import copy_trust, generate_keys


def sign_bundle(path: str, private_key: str, certificate: str | None = None, chain: tuple = ()) -> str:
    """Signs every file of the bundle directory into BUNDLE/model.sig (what the
    stock CLI does with --signature BUNDLE/model.sig); with `certificate` (and
    its intermediate `chain`), a certificate signature."""
    model_signing = signinglib.model_signing()

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


def throwaway_signed_copy(bundle: str, workdir: str, name: str) -> tuple[str, str]:
    """For local runs (demo, benchmarks): a copy of `bundle` in workdir/bundle,
    signed with a new key pair made for it, and a trust store (workdir/trust)
    holding only that key. Returns (signed bundle, trust dir)."""
    trust = os.path.join(workdir, "trust")
    signed = os.path.join(workdir, "bundle")
    self_sign(bundle, signed, trust, name)
    return signed, trust


def self_sign(bundle: str, out: str, trust_dir: str, key_name: str | None = None,
              check: Callable[[str, str], object] | None = None) -> str:
    """A first run's signature (`edgeinferctl model self-sign`): copies `bundle` to `out` (which must
    not exist; the source is left as it is), signs the copy with a new P-256 key pair made for it, and
    installs the public key as trust_dir/KEY_NAME.pub (default: self-signed-NAME-VERSION from
    model.yaml; an existing entry is never overwritten). The private key lives only in a private
    temporary directory and is deleted once the copy is signed: that key can sign nothing else.
    Nothing of the daemon's checks is relaxed: `check(out, trust_dir)` (e.g. bundlecheck.check_bundle)
    then verifies the result as the daemon would. On any failure, that check's included, the copy and
    the installed key are removed again. Returns the installed key's path."""
    from edgeinfer.models.bundle import load_unverified_bundle

    if key_name is not None and (not key_name or "/" in key_name or key_name.startswith(".")):
        raise ValueError(f"key name {key_name!r}: a file name in the trust store (no '/', not starting with '.')")
    if os.path.lexists(out):
        raise FileExistsError(f"{out} exists; self-sign writes a new copy of the bundle there")
    if not os.path.isdir(bundle):
        raise BundleError(f"{bundle}: a model bundle is a directory")
    pub_dest = None
    try:
        shutil.copytree(bundle, out, symlinks=True)  # a symlink stays one: the daemon's checks refuse it
        if key_name is None:
            meta = load_unverified_bundle(out).meta
            key_name = f"self-signed-{meta.name}-{meta.version}"
        if os.path.lexists(os.path.join(trust_dir, key_name + ".pub")):
            raise FileExistsError(f"{os.path.join(trust_dir, key_name + '.pub')} exists; refusing to replace a "
                                  "trusted key (give another --key-name)")
        with tempfile.TemporaryDirectory(prefix="edgeinfer-self-sign-") as keys:  # 0700, removed with the key
            key, pub = generate_keys(keys, key_name)
            sign_bundle(out, key)
            pub_dest = copy_trust(pub, trust_dir)
        if check is not None:
            check(out, trust_dir)
        return pub_dest
    except BaseException:
        if pub_dest is not None:
            os.unlink(pub_dest)
        shutil.rmtree(out, ignore_errors=True)
        raise
