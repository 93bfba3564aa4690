"""Compatibility: `edgeinfer.payloads` (describe, tensors) is documented for readers (docs/abi.md,
docs/decoders.md), so it stays.

The module lives at edgeinfer.abi.payloads; this name is the same module object. Only documented public names
get such a module: code inside the package imports edgeinfer.abi.payloads."""
import sys

from edgeinfer.abi import payloads as _payloads_module

sys.modules[__name__] = _payloads_module
