"""Network fronts (edgeinfer-gateway): the Open Inference Protocol over gRPC and Frigate's ZeroMQ detector
protocol, in a process of their own that is to the daemon exactly a camera and a reader of its pools' streams.
Rank 4. Its modules, one job each: docs/architecture.md, "Module map"."""
