"""Generates the Python gRPC stubs from protos/ with grpcio-tools: `python -m seqserve.protogen` (or `make protos`).

The generated files are committed and never hand-edited; tests/server/test_stubs.py regenerates them into a
temporary directory and fails when the committed ones differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent.parent  # protos/, which holds seqserve/v1/seqserve.proto
PROTOS = ("seqserve/v1/seqserve.proto",)
GENERATED = ("seqserve/v1/seqserve_pb2.py", "seqserve/v1/seqserve_pb2.pyi", "seqserve/v1/seqserve_pb2_grpc.py")


def _protoc(args: list[str]) -> None:
    from importlib import resources

    from grpc_tools import protoc  # dev dependency: only needed to regenerate, never to serve

    well_known = str(resources.files("grpc_tools") / "_proto")  # what `python -m grpc_tools.protoc` adds itself
    code = protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", *args])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} (args {args})")


def generate(out_dir: str | Path = PROTO_ROOT) -> list[Path]:
    """Writes the stubs for every proto under out_dir (the committed tree by default); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    protos = [str(PROTO_ROOT / p) for p in PROTOS]
    _protoc([f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", *protos])
    return [out / g for g in GENERATED]


def descriptor_set(path: str | Path) -> Path:
    """Writes a FileDescriptorSet with source comments (tests use it to check every field is documented)."""
    _protoc([f"--descriptor_set_out={path}", "--include_source_info", *(str(PROTO_ROOT / p) for p in PROTOS)])
    return Path(path)


def main() -> int:
    for path in generate():
        print(f"wrote {path.relative_to(PROTO_ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
