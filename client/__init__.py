"""The client of a running seqserve server: the generation client, the connection flags, the health check and the
services listing. No onnxruntime and no engine: it imports only the contract and the generated gRPC code, so a load
generator or a container probe loads nothing of the server's."""
