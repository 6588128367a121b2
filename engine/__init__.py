"""The engine core: scheduling, token rules, outputs and onnxruntime execution; no gRPC, asyncio or Prometheus."""
