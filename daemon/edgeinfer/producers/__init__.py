"""Compatibility: the reference producers moved to edgeinfer.cameras. Only the documented command
`python -m edgeinfer.producers.avdecode` stays here (avdecode.py)."""
