"""The daemon's control plane: its wiring and serve loop, what it takes in, the models it serves, and what it
reports. Rank 4. Its modules, one job each: docs/architecture.md, "Module map"."""
