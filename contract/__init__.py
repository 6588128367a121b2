"""The bundle contract between export and server: ONNX names, the manifest, tokenizer loading, shared constants.

No torch and no onnxruntime: both sides, and the tools above them, import it.
"""
