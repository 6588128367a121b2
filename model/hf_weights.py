"""The weight files of a Hugging Face directory (model.safetensors, or the shards its index names), each confined to
the directory and its header checked here, bounded, before safetensors opens it: a corrupt, truncated or hostile file
is refused naming the file and the tensor, and so are non-floating or non-finite weights (docs/import.md)."""
from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from seqserve.contract.jsonfile import confined, read_object

HF_WEIGHTS = "model.safetensors"
HF_WEIGHTS_INDEX = "model.safetensors.index.json"  # sharded weights
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
PROGRESS_MIN_BYTES = 100 << 20  # show a progress bar when the weights are at least this large
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on a file's JSON header
MAX_RANK = 8  # a weight is a vector or a matrix; far more dimensions is a corrupt header
# Every dtype safetensors writes -> its bytes per element (offsets are checked for all, then non-floats refused).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOATING = ("F16", "BF16", "F32")  # read as float32, exactly
WIDENED = "F64"  # converted to float32 with a warning: the precision seqserve computes in (docs/import.md)
CONVERT_HINT = ("convert it once with transformers: AutoModelForSeq2SeqLM.from_pretrained(d)"
                ".save_pretrained(d, safe_serialization=True)")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header, its offsets checked against the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def weight_files(hf_dir: Path, error: type[Exception]) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names; each inside hf_dir."""
    single = confined(hf_dir, HF_WEIGHTS, error)
    if single.is_file():
        return [single]
    index = confined(hf_dir, HF_WEIGHTS_INDEX, error)
    if index.is_file():
        weight_map = read_object(index, error).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
            raise error(f"{index}: weight_map must be an object of tensor name -> shard file name, got "
                        f"{_shown(weight_map)}")
        shards = [confined(hf_dir, name, error) for name in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.is_file()]
        if not shards or missing:
            raise error(f"{index}: weight_map: shard(s) {missing or 'none listed'} missing")
        return shards
    pickles = [p for p in PICKLES if (hf_dir / p).is_file()]
    if pickles:
        raise error(f"{hf_dir / pickles[0]}: pickle weights are never loaded (a pickle can run code); "
                    f"{CONVERT_HINT}, which writes {HF_WEIGHTS}")
    raise error(f"{single}: missing")


def read_header(path: Path, error: type[Exception]) -> list[TensorEntry]:
    """The file's tensors, refused unless the header is what safetensors requires: an 8-byte little-endian length,
    at most MAX_HEADER_BYTES of JSON, and tensors whose dtype, shape and offsets tile the rest of the file exactly."""
    size = path.stat().st_size
    if size < 8:
        raise error(f"{path}: {size} bytes, too short for a safetensors file (an 8-byte header length comes first)")
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise error(f"{path}: the header claims {length} bytes; the file has {size - 8} after the length and a "
                        f"header may have at most {MAX_HEADER_BYTES}: not a safetensors file, or a truncated one")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{path}: the header is not a JSON object ({type(exc).__name__}): not a safetensors file") from None
    if not isinstance(header, dict):
        raise error(f"{path}: the header is not a JSON object: not a safetensors file")
    data_bytes, spans, entries = size - 8 - length, [], []
    for name, spec in header.items():
        if name == "__metadata__":
            if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
                raise error(f"{path}: __metadata__ must be an object of strings")
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
            raise error(f"{where}: must be an object with dtype, shape and data_offsets, got {_shown(spec)}")
        dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise error(f"{where}: dtype {_shown(dtype)} is not a safetensors dtype")
        if not (isinstance(shape, list) and len(shape) <= MAX_RANK and all(_count(d) for d in shape)):
            raise error(f"{where}: shape must be a list of at most {MAX_RANK} non-negative integers, got "
                        f"{_shown(shape)}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
                and offsets[0] <= offsets[1] <= data_bytes):
            raise error(f"{where}: data_offsets {_shown(offsets)} do not lie within the file's {data_bytes} data "
                        "bytes (a truncated file?)")
        entry = TensorEntry(name, dtype, tuple(shape))
        if offsets[1] - offsets[0] != entry.numel * DTYPE_BYTES[dtype]:
            raise error(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes; shape "
                        f"{list(shape)} of {dtype} needs {entry.numel * DTYPE_BYTES[dtype]}")
        spans.append((offsets[0], offsets[1], name))
        entries.append(entry)
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise error(f"{path}: tensor {name!r} starts at byte {begin} of the data, expected {end} (tensors must "
                        "tile the data without gaps or overlaps)")
        end = stop
    if end != data_bytes:
        raise error(f"{path}: the tensors cover {end} of the file's {data_bytes} data bytes")
    for entry in entries:  # after the layout checks: a non-float tensor is refused by name, not as corruption
        if entry.dtype not in FLOATING + (WIDENED,):
            raise error(f"{path}: tensor {entry.name!r} has dtype {entry.dtype}; weights must be floating point "
                        f"({', '.join(FLOATING)}; {WIDENED} is converted to float32)")
    return entries


def read_headers(files: list[Path], error: type[Exception]) -> dict[Path, list[TensorEntry]]:
    """Every file's header; a tensor name (without "model.") in two places is refused."""
    headers, seen = {}, {}
    for file in files:
        headers[file] = read_header(file, error)
        for entry in headers[file]:
            short = entry.name.removeprefix("model.")
            if short in seen:
                raise error(f"{file}: tensor {entry.name!r} is also in {seen[short]}; each weight must be stored once")
            seen[short] = file.name
    return headers


def read_weights(headers: dict[Path, list[TensorEntry]], error: type[Exception],
                 progress: bool = True) -> dict[str, torch.Tensor]:
    """The tensors (names without "model."), as float32; a non-finite value is refused naming the tensor."""
    size = sum(f.stat().st_size for f in headers)
    tensors: dict[str, torch.Tensor] = {}
    with tqdm(total=size, unit="B", unit_scale=True, desc="read weights", disable=not progress or
              size < PROGRESS_MIN_BYTES, file=sys.stderr) as bar:
        for file, entries in headers.items():
            widened = [e.name for e in entries if e.dtype == WIDENED]
            if widened:
                print(f"seqserve import: warning: {file}: {len(widened)} tensor(s) stored as {WIDENED} (first "
                      f"{widened[0]!r}) are converted to float32, the precision seqserve computes in", file=sys.stderr)
            try:
                with safe_open(str(file), framework="pt") as f:
                    for entry in entries:
                        value = f.get_tensor(entry.name).to(torch.float32)
                        if not bool(torch.isfinite(value).all()):
                            raise error(f"{file}: tensor {entry.name!r} holds NaN or infinite values "
                                        f"({int((~torch.isfinite(value)).sum())} of {value.numel()} as float32)")
                        tensors[entry.name.removeprefix("model.")] = value
                        bar.update(file.stat().st_size / max(len(entries), 1))
            except (SafetensorError, OSError, RuntimeError) as exc:  # checked above; this is a last guard
                raise error(f"{file}: safetensors cannot read it: {exc}") from None
    return tensors


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
