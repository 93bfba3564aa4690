"""Metrics (Prometheus text, /healthz, /readyz) and the bounded HTTP listener that serves them."""
