"""Compatibility, deprecated: the reference producers moved to edgeinfer.cameras. Only the old command
`python -m edgeinfer.producers.avdecode` stays here (avdecode.py), for camera services started before an
upgrade, until its removal in 0.4.0; the ffmpeg producer launches `python -m edgeinfer.cameras.avdecode`.
Its modules, one job each: docs/architecture.md, "Module map"."""
