"""The ABI: ring.py (the only importer of the native core), the vocabulary of formats, outcomes and payload
kinds, and result payloads. The bottom layer, with support/: it imports nothing else of edgeinfer."""
