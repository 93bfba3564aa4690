"""Compatibility: `from edgeinfer import ring` is the documented Python API (docs/abi.md, README), so it stays.

The module lives at edgeinfer.abi.ring; this name is the same module object (not a copy), so its classes and
exceptions are identical under both names. Only documented public names get such a module: code inside the
package imports edgeinfer.abi.ring (tests/unit/test_layers.py refuses the old name inside the package)."""
import sys

from edgeinfer.abi import ring as _ring_module

sys.modules[__name__] = _ring_module
