"""edgeinferd's configuration: the schema (and what older files are accepted as) and who may produce or read."""
