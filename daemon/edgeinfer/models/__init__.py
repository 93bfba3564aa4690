"""Model bundles and what runs them: loading, checks, signing, the runtime, output decoders (decoders/) and
the offline tools (tools/). Rank 1. Its modules, one job each: docs/architecture.md, "Module map"."""
