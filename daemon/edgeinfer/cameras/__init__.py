"""Cameras: camera services (`edgeinferctl camera`), frame sources, and the reference producers. Rank 3.
Its modules, one job each: docs/architecture.md, "Module map"."""
