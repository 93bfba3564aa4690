"""Model bundles: loading, checks, signing, the rollback floor, the runtime, the fused pre-processing graph,
output decoders (decoders/) and the offline tools (tools/: quantize, bench, bundle writing)."""
