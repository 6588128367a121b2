"""What the load test sends: inputs from the held-out split the bundle was evaluated on, and decoding options."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

from seqserve.client.client import options
from seqserve.v1 import seqserve_pb2 as pb


def heldout_file(path: str | Path) -> Path:
    """A heldout.tsv file, or a bundle directory holding one."""
    path = Path(path)
    found = path / "heldout.tsv" if path.is_dir() else path
    if not found.is_file():
        raise FileNotFoundError(f"no held-out split at {found} (pass --heldout BUNDLE_DIR or a source<TAB>target file)")
    return found


def heldout_sources(path: str | Path) -> list[str]:
    """The source column of `source<TAB>target` lines."""
    sources = [line.split("\t", 1)[0] for line in heldout_file(path).read_text().splitlines() if line.strip()]
    if not sources:
        raise ValueError(f"{heldout_file(path)} has no lines")
    return sources


def add_language_arguments(parser) -> None:
    """A multilingual model's language mix: one source language, the target languages cycled call by call."""
    parser.add_argument("--source-language", default="", help="a multilingual model's source language code, e.g. "
                                                              "en_XX (unset: none, for a model without languages)")
    parser.add_argument("--languages", default="", help="target language codes the calls cycle through, comma-"
                                                        "separated, e.g. fr_XX,de_DE (unset: none)")


def target_languages(value: str) -> tuple[str, ...]:
    """--languages fr_XX,de_DE -> ("fr_XX", "de_DE")."""
    return tuple(code.strip() for code in (value or "").split(",") if code.strip())


@dataclass
class Workload:
    sources: list[str]
    decoding: dict = field(default_factory=dict)  # DecodingOptions keywords; None = the server's default
    timeout: float | None = None  # deadline of each call in seconds
    source_language: str = ""  # a multilingual model's source language code
    target_languages: tuple[str, ...] = ()  # cycled: call i asks for target_languages[i % n]
    model: str = ""  # the model every call names ("" = the server's one model)
    options: pb.DecodingOptions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Built once, so a misspelt or mistyped option fails the run at start rather than on every call.
        self.options = options(**self.decoding)
        self._targets = itertools.cycle(self.target_languages or ("",))

    def request(self, rng: random.Random) -> pb.GenerateRequest:
        return pb.GenerateRequest(input=rng.choice(self.sources), options=self.options, model=self.model,
                                  source_language=self.source_language, target_language=next(self._targets))
