"""The daemon's control plane: its wiring and serve loop, ingress (handshakes), admission, the model registry
and reload, the closer of clients' fds, and the status snapshot."""
