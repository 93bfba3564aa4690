"""Offline model tools behind `edgeinferctl model`: bundle writing, quantization, benchmarks."""
