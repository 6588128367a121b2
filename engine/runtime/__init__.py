"""onnxruntime: the runner, its slots, the KV caches, copy graphs and the device."""
