"""Small leaf helpers. The bottom layer, with abi/: it imports nothing else of edgeinfer.
Its modules, one job each: docs/architecture.md, "Module map"."""
