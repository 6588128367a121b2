"""Settings from flags and SEQSERVE_* variables (flags win), validated at start with clear errors."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from seqserve.cli.main import build_parser
from seqserve.contract.devices import DEVICES
from seqserve.server import settings as st

REPO = Path(__file__).resolve().parents[2]


def _flags(*argv: str) -> dict:
    return vars(build_parser().parse_args(["serve", *argv]))


def test_flags_beat_environment_beat_defaults(tiny_bundle):
    env = {"SEQSERVE_BUNDLE": str(tiny_bundle), "SEQSERVE_PORT": "7000", "SEQSERVE_MAX_BATCH_SIZE": "4",
           "SEQSERVE_ALLOW_SPINNING": "false", "SEQSERVE_GRACE_SECONDS": "2.5"}
    s = st.load(_flags("--port", "7001", "--allow-spinning"), env)
    assert (s.port, s.allow_spinning, s.max_batch_size, s.grace_seconds) == (7001, True, 4, 2.5)
    assert s.bundle == tiny_bundle and s.metrics_port == 9090 and s.device == "auto"
    assert st.load(_flags(), env).allow_spinning is False


@pytest.mark.parametrize("argv, env, message", [
    ((), {}, "the bundle is required: --bundle or SEQSERVE_BUNDLE"),
    (("--bundle", "/nonexistent"), {}, "bundle /nonexistent: no manifest.json"),
    (("--port", "70000"), {}, "--port / SEQSERVE_PORT must be in [0, 65535], got 70000"),
    ((), {"SEQSERVE_MAX_BATCH_SIZE": "0"}, "--max-batch-size / SEQSERVE_MAX_BATCH_SIZE must be in [1, inf], got 0"),
    ((), {"SEQSERVE_MAX_WAITING": "lots"}, "SEQSERVE_MAX_WAITING='lots' is not a valid int"),
    ((), {"SEQSERVE_ALLOW_SPINNING": "maybe"}, "SEQSERVE_ALLOW_SPINNING='maybe' is not a valid bool"),
    ((), {"SEQSERVE_DEVICE": "tpu"}, "--device / SEQSERVE_DEVICE must be one of"),
    (("--max-waiting", "4"), {}, "--max-batch-inputs / SEQSERVE_MAX_BATCH_INPUTS (64) exceeds --max-waiting"),
    (("--grace-seconds", "-1"), {}, "--grace-seconds / SEQSERVE_GRACE_SECONDS must be in [0, inf]"),
])
def test_invalid_settings_name_the_flag_and_the_variable(tiny_bundle, argv, env, message):
    env = {"SEQSERVE_BUNDLE": str(tiny_bundle)} | env if "bundle" not in message else env
    with pytest.raises(st.SettingsError) as info:
        st.load(_flags(*argv), env)
    assert message in str(info.value)


def test_limits_default_to_the_bundle_and_refuse_more(tiny_bundle):
    s = st.Settings(bundle=tiny_bundle)
    limits = s.limits(model_max_positions=64, bundle_max_new_tokens=40)
    assert (limits.max_input_tokens, limits.max_new_tokens, limits.default_max_new_tokens) == (64, 40, 40)
    with pytest.raises(st.SettingsError, match="max-new-tokens / SEQSERVE_MAX_NEW_TOKENS 50 exceeds the bundle's"):
        dataclasses.replace(s, max_new_tokens=50).limits(64, 40)
    with pytest.raises(st.SettingsError, match="max_positions"):
        dataclasses.replace(s, max_input_tokens=65).limits(64, 40)
    assert dataclasses.replace(s, default_max_new_tokens=8).limits(64, 40).default_max_new_tokens == 8


def test_every_device_flag_offers_the_one_device_list():
    parser = build_parser()
    for command in ("serve", "verify", "bench"):
        action = next(a for a in parser._subparsers._group_actions[0].choices[command]._actions
                      if "--device" in a.option_strings)
        assert tuple(action.choices) == DEVICES, command


def test_a_taken_port_is_a_clear_error(served, make_server):
    with pytest.raises(st.SettingsError, match="cannot listen on 127.0.0.1"):
        make_server(port=served.app.port, metrics_port=-1)


def test_serve_help_documents_every_flag_and_its_variable():
    out = subprocess.run([sys.executable, "-m", "seqserve.cli", "serve", "--help"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    for f in dataclasses.fields(st.Settings):
        assert f"--{f.name.replace('_', '-')}" in out and st.env_name(f.name) in out
