"""The inference lanes, and the control plane's side of them. Rank 3: never imports control/.
Its modules, one job each: docs/architecture.md, "Module map"."""
