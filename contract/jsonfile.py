"""Reading files of a directory someone else wrote (an import's model directory, a generation config): confined to
that directory, bounded in size and JSON nesting, with errors that name the file."""
from __future__ import annotations

import json
from pathlib import Path

MAX_JSON_BYTES = 64 << 20  # a tokenizer.json of a 250k vocabulary is about 20 MB; configs are kilobytes
MAX_JSON_DEPTH = 32  # as a bundle manifest (contract/manifest.py)


def depth(data, limit: int = MAX_JSON_DEPTH) -> int:
    """How deeply lists and objects nest, up to one level past `limit` (iteratively: json.dumps and checkers recurse)."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        node, level = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= limit:  # deeper is refused anyway: no need to walk further
                todo += [(child, level + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def roots(directory: Path) -> list[Path]:
    """Where the files of `directory` may lie: the directory itself and, for a snapshot of the Hugging Face cache
    (`models--ORG--NAME/snapshots/REV/`, whose files are links into `models--ORG--NAME/blobs/`), that model's blobs."""
    directory = Path(directory).resolve()
    blobs = directory.parent.parent / "blobs"
    return [directory, blobs.resolve()] if directory.parent.name == "snapshots" and blobs.is_dir() else [directory]


def confined(directory: Path, name: str | Path, error: type[Exception]) -> Path:
    """directory/name, refused (error naming the file) when it resolves outside `directory` (or, for a Hugging Face
    cache snapshot, outside its model's blobs): `..`, an absolute name or a symlink leading out. Existence is not
    checked here."""
    directory = Path(directory)
    path = directory / name
    target = path.resolve()
    if Path(name).is_absolute() or not any(target.is_relative_to(root) for root in roots(directory)):
        raise error(f"{path}: resolves outside {directory}; every file an import reads must lie inside it")
    return path


def read_bytes(path: Path, error: type[Exception], limit: int, missing: str = "missing") -> bytes:
    """The whole file, refused before reading when it is absent, not a regular file, or over `limit` bytes."""
    if not path.is_file():
        raise error(f"{path}: {missing}")
    size = path.stat().st_size
    if size > limit:
        raise error(f"{path}: {size} bytes, more than such a file may have ({limit})")
    return path.read_bytes()


def read_json(path: Path, error: type[Exception], missing: str = "missing", limit: int = MAX_JSON_BYTES):
    """The file's JSON value, bounded in bytes and nesting depth; error(message naming the file) otherwise."""
    raw = read_bytes(path, error, limit, missing)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    if depth(data) > MAX_JSON_DEPTH:
        raise error(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep")
    return data


def read_object(path: Path, error: type[Exception], missing: str = "missing", limit: int = MAX_JSON_BYTES) -> dict:
    """The file's JSON object; error(message naming the file) when it is absent, too big or deep, not JSON, or not an
    object."""
    data = read_json(path, error, missing, limit)
    if not isinstance(data, dict):
        raise error(f"{path}: must be a JSON object")
    return data
