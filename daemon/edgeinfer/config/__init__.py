"""edgeinferd's configuration: the schema (and what older files are accepted as) and who may produce or read.
Rank 2. Its modules, one job each: docs/architecture.md, "Module map"."""
