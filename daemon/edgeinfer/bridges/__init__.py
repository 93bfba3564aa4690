"""Bridges: reader processes that carry results off the host (edgeinfer-mqtt). Rank 4, beside control and fronts:
to edgeinferd a bridge is one more reader of the result rings, with no privilege the ABI does not grant any reader.
Its modules, one job each: docs/architecture.md, "Module map"."""
