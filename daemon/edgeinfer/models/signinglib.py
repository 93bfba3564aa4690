"""model-signing, imported without its Sigstore path: `model_signing()` returns the package.

Bundles are signed and verified with a key or a certificate (sign.py, verify.py), never with Sigstore, yet
`import model_signing` imports its Sigstore signer and verifier (`model_signing._signing.sign_sigstore`) from
both `signing` and `verifying`, and with them sigstore, tuf, requests, urllib3, securesystemslib, rekor and
rfc3161 clients: 253 modules and ~240 ms of the daemon's start that no bundle uses (580 modules -> 327).
That one module is put in `sys.modules` as a placeholder first, so both import the placeholder; it imports
the real module at the first use of any of its names (a Sigstore signature would still work), and the
placeholder then holds the real module's names. tests/integration/test_startup_imports.py holds the daemon
to it."""
from __future__ import annotations

import importlib
import sys
import types

SIGSTORE_MODULE = "model_signing._signing.sign_sigstore"


class _Deferred(types.ModuleType):
    """A module imported at the first look-up of a name it does not hold (and never before)."""

    def __getattr__(self, attr: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def model_signing():
    """The model_signing package, its Sigstore module deferred (see above) unless it is already imported."""
    if "model_signing" not in sys.modules and SIGSTORE_MODULE not in sys.modules:
        sys.modules[SIGSTORE_MODULE] = _Deferred(SIGSTORE_MODULE)
    import model_signing as package
    return package
