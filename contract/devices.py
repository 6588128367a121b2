"""Where onnxruntime runs: the one list of device choices every command and setting offers (no onnxruntime import)."""

DEVICES = ("auto", "cpu", "cuda")  # auto: CUDA when onnxruntime can create it, else CPU
CUDA_PROVIDER, CPU_PROVIDER = "CUDAExecutionProvider", "CPUExecutionProvider"
