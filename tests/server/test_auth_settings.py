"""An explicitly empty token list or token file is refused at start (exit 2 naming the flag or the variable): it
would serve every call without authentication, while an unset one turns authentication off on purpose."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqserve.server import settings as st

SEQSERVE = Path(sys.executable).parent / "seqserve"  # the console script pip installed, as a user runs it


def _serve(bundle: Path, *flags: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A real `seqserve serve`: refused at start it exits 2; accepted it would serve (and time out here)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")} | env
    return subprocess.run([str(SEQSERVE), "serve", "--bundle", str(bundle), "--port", "0", "--metrics-port", "-1",
                           "--device", "cpu", *flags], env=environ, capture_output=True, text=True, timeout=120)


def test_serve_with_an_empty_auth_tokens_flag_exits_2_naming_it(tiny_bundle):
    done = _serve(tiny_bundle, "--auth-tokens", "", env={})
    assert done.returncode == 2, done.stderr
    assert "--auth-tokens / SEQSERVE_AUTH_TOKENS holds no token (it is empty" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["SEQSERVE_AUTH_TOKENS", "SEQSERVE_AUTH_TOKEN_FILE"])
def test_serve_with_an_empty_auth_variable_exits_2_naming_it(tiny_bundle, name):
    done = _serve(tiny_bundle, env={name: ""})
    assert done.returncode == 2, done.stderr
    assert f"{name} is set but empty: unset it to turn authentication off" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unset_variable_still_means_no_authentication_and_a_flag_wins_over_an_empty_variable(tiny_bundle):
    bundle = {"SEQSERVE_BUNDLE": str(tiny_bundle)}
    assert st.load({}, bundle).tokens() == frozenset()
    token = "t" * 32
    assert st.load({"auth_tokens": token}, bundle | {"SEQSERVE_AUTH_TOKENS": ""}).tokens() == {token}
    with pytest.raises(st.SettingsError, match="holds no token"):
        st.Settings(bundle=tiny_bundle, auth_tokens="")
