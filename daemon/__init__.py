"""edgeinfer: zero-copy, real-time ONNX inference on shared-memory camera frames."""
