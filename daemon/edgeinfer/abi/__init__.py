"""The ABI: ring.py (the facade over the native core; ringdefs.py, framewriter.py and daemonside.py hold
what it re-exports), the vocabulary of formats, outcomes and payload kinds,
result payloads, the histograms, and constants: abi/ is the only importer of the native core. The bottom layer,
with support/: it imports nothing else of edgeinfer."""
