"""Checks that need both PyTorch and the engine: verify, onnxruntime/PyTorch parity, precision variants' quality."""
