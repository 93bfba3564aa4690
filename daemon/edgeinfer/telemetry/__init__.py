"""Metrics (Prometheus text, /healthz, /readyz) and the bounded HTTP listener that serves them. Rank 3.
Its modules, one job each: docs/architecture.md, "Module map"."""
