"""Offline model tools behind `edgeinferctl model`: bundle writing, quantization, benchmarks.
Its modules, one job each: docs/architecture.md, "Module map"."""
