"""client/flags.py holds what every command shares, once: the default address, a field's flag name, the boolean
words. Each command's default is that address, and no other module spells it or builds a flag name itself."""
from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from seqserve.cli.main import build_parser
from seqserve.client.client import Client
from seqserve.client.flags import DEFAULT_ADDRESS, DEFAULT_PORT, LOOPBACK, flag, parse_bool
from seqserve.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("cli", "client", "contract", "checks", "export", "loadtest", "model", "server", "engine")


def test_parse_bool_takes_the_usual_words_and_refuses_others():
    assert [parse_bool(w) for w in ("true", " YES", "1", "on", "false", "No ", "0", "off")] == [True] * 4 + [False] * 4
    for word in ("", "maybe", "2", "y"):
        with pytest.raises(ValueError, match="not a boolean"):
            parse_bool(word)


def test_flag_names_a_field():
    assert flag("max_new_tokens") == "--max-new-tokens" and flag("no_reflection") == "--no-reflection"


def test_the_commands_default_to_the_address_the_server_binds():
    defaults = {f.name: f.default for f in fields(Settings)}
    assert (defaults["bind"], defaults["port"]) == (LOOPBACK, DEFAULT_PORT)
    assert build_parser().parse_args(["generate", "x"]).server == DEFAULT_ADDRESS
    assert build_parser().parse_args(["loadtest"]).target == DEFAULT_ADDRESS
    with Client() as client:
        assert client.address == DEFAULT_ADDRESS


def _constants(path: Path) -> list[object]:
    return [node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)]


def test_no_other_module_spells_the_address_or_builds_a_flag_name():
    offenders = []
    for path in sorted(p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py")):
        if path.name == "flags.py":
            continue
        constants = _constants(path)
        if DEFAULT_PORT in constants or DEFAULT_ADDRESS in constants:
            offenders.append(f"{path.relative_to(ROOT)}: the default address")
        if '.replace("_", "-")' in path.read_text():
            offenders.append(f"{path.relative_to(ROOT)}: a flag name")
    assert not offenders, offenders
