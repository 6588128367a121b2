"""Reading a JSON file that must hold one object, with errors that name the file (import, tokenizer, generation)."""
from __future__ import annotations

import json
from pathlib import Path


def read_object(path: Path, error: type[Exception], missing: str = "missing") -> dict:
    """The file's JSON object; error(message naming the file) when it is absent, not JSON, or not an object."""
    if not path.is_file():
        raise error(f"{path}: {missing}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: must be a JSON object")
    return data
