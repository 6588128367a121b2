"""Settings from flags and SEQSERVE_* variables (flags win), validated at start with clear errors."""
from __future__ import annotations

import dataclasses
import os
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
    assert s.bundle == tiny_bundle and s.metrics_port == 50052 and s.device == "auto"
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
    (("--grace-seconds", "nan"), {}, "--grace-seconds / SEQSERVE_GRACE_SECONDS must be in [0, inf], got nan"),
    ((), {"SEQSERVE_GRACE_SECONDS": "inf"}, "--grace-seconds / SEQSERVE_GRACE_SECONDS must be in [0, inf], got inf"),
    (("--drain-backlog-seconds", "nan"), {}, "--drain-backlog-seconds / SEQSERVE_DRAIN_BACKLOG_SECONDS must be in"),
    (("--max-pending-calls", "0"), {}, "--max-pending-calls / SEQSERVE_MAX_PENDING_CALLS must be in [1, inf]"),
    (("--max-health-watches", "-1"), {}, "--max-health-watches / SEQSERVE_MAX_HEALTH_WATCHES must be in [0, inf]"),
    (("--tls-cert-file", __file__), {}, "TLS needs both --tls-cert-file / SEQSERVE_TLS_CERT_FILE and --tls-key-file"),
    (("--tls-client-ca-file", __file__), {}, "--tls-client-ca-file / SEQSERVE_TLS_CLIENT_CA_FILE (mutual TLS) needs"),
    (("--tls-cert-file", "/nonexistent.pem", "--tls-key-file", __file__), {},
     "--tls-cert-file / SEQSERVE_TLS_CERT_FILE: no file at /nonexistent.pem"),
    ((), {"SEQSERVE_AUTH_TOKENS": "short,also-short"}, "2 bearer token(s) shorter than 16 characters"),
    # blank token lists are refused like a blank token file, never read as "authentication off" (issue 16, item 4)
    ((), {"SEQSERVE_AUTH_TOKENS": " "}, "--auth-tokens / SEQSERVE_AUTH_TOKENS holds no token"),
    ((), {"SEQSERVE_AUTH_TOKENS": ","}, "--auth-tokens / SEQSERVE_AUTH_TOKENS holds no token"),
    ((), {"SEQSERVE_AUTH_TOKENS": " , "}, "--auth-tokens / SEQSERVE_AUTH_TOKENS holds no token"),
    (("--auth-tokens", " ,\t"), {}, "--auth-tokens / SEQSERVE_AUTH_TOKENS holds no token"),
    (("--auth-token-file", "/nonexistent"), {}, "--auth-token-file / SEQSERVE_AUTH_TOKEN_FILE: no file at"),
    (("--max-receive-message-bytes", "100"), {}, "--max-receive-message-bytes / SEQSERVE_MAX_RECEIVE_MESSAGE_BYTES "
                                                 "must be in [1024, inf]"),
    (("--max-inflight-bytes", "2048"), {}, "--max-receive-message-bytes / SEQSERVE_MAX_RECEIVE_MESSAGE_BYTES "
                                           "(262144) exceeds --max-inflight-bytes"),
    (("--max-stop-bytes", "0"), {}, "--max-stop-bytes / SEQSERVE_MAX_STOP_BYTES must be in [1, inf], got 0"),
    # the widest beam any server grants (contract/decoding.py): a model's default num_beams is held to it too
    (("--max-num-beams", "1025"), {}, "--max-num-beams / SEQSERVE_MAX_NUM_BEAMS must be in [1, 1024], got 1025"),
    (("--front-ends", "2"), {}, "--front-ends / SEQSERVE_FRONT_ENDS 2 needs --engine-process"),
    (("--front-ends", "0", "--engine-process"), {}, "--front-ends / SEQSERVE_FRONT_ENDS must be in [1, 64], got 0"),
    (("--front-ends", "65", "--engine-process"), {}, "--front-ends / SEQSERVE_FRONT_ENDS must be in [1, 64]"),
    (("--engine-cpus", "0-"), {}, "--engine-cpus / SEQSERVE_ENGINE_CPUS: not a CPU list (like 0 or 0,2-3): '0-'"),
    ((), {"SEQSERVE_ENGINE_CPUS": "a"}, "--engine-cpus / SEQSERVE_ENGINE_CPUS: not a CPU list"),
    (("--engine-cpus", "3-1"), {}, "--engine-cpus / SEQSERVE_ENGINE_CPUS: not a CPU list"),
    (("--engine-cpus", "0,4096"), {}, "--engine-cpus / SEQSERVE_ENGINE_CPUS: not a CPU list"),
    (("--engine-cpus", f"0-{os.cpu_count()}"), {}, f"names CPUs this machine does not have (it has 0-"
                                                   f"{os.cpu_count() - 1})"),
])
def test_invalid_settings_name_the_flag_and_the_variable(tiny_bundle, argv, env, message):
    env = {"SEQSERVE_BUNDLE": str(tiny_bundle)} | env if "bundle" not in message else env
    with pytest.raises(st.SettingsError) as info:
        st.load(_flags(*argv), env)
    assert message in str(info.value)


def test_secure_by_default_and_secrets_stay_out_of_logs(tiny_bundle, tmp_path):
    s = st.load({}, {"SEQSERVE_BUNDLE": str(tiny_bundle), "SEQSERVE_AUTH_TOKENS": "x" * 16 + ", " + "y" * 20})
    assert s.bind == s.metrics_bind == "127.0.0.1" and s.tls_cert_file is None
    assert s.tokens() == {"x" * 16, "y" * 20} and "x" * 16 not in repr(s)
    assert st.load({}, {"SEQSERVE_BUNDLE": str(tiny_bundle), "SEQSERVE_BIND": "0.0.0.0"}).bind == "0.0.0.0"
    empty = tmp_path / "tokens"
    empty.write_text("# nothing yet\n")
    with pytest.raises(st.SettingsError, match="holds no token"):
        st.Settings(bundle=tiny_bundle, auth_token_file=empty)


def test_serve_exits_2_naming_the_variable_for_a_blank_token_list(tiny_bundle):
    """A real process (it would serve without authentication, and never exit, if the blank list were accepted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")} | {"SEQSERVE_AUTH_TOKENS": " , "}
    done = subprocess.run([sys.executable, "-m", "seqserve.cli", "serve", "--bundle", str(tiny_bundle), "--port", "0",
                           "--metrics-port", "-1", "--device", "cpu"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "SEQSERVE_AUTH_TOKENS holds no token" in done.stderr, done.stderr


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
