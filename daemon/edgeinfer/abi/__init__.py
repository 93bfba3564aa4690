"""The ABI: ring.py (the facade over the native core) and the names and records the daemon and its clients
share. abi/ is the only importer of the native core. The bottom layer, with support/: it imports nothing else
of edgeinfer. Its modules, one job each: docs/architecture.md, "Module map"."""
