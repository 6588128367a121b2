"""deploy/bundle.sh (`seqserve-bundle`, the compose trainer and the Kubernetes Job and init container), run for real
on the tiny checkpoint. Training the default preset takes minutes, so the runs here start from a trained checkpoint;
docs/deploy.md reports a full build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_harness import DEPLOY

from seqserve.checks.verify import is_verified

SCRIPT = DEPLOY / "bundle.sh"


SERVE_IMAGE_LACKS = ("torch", "onnx", "onnxscript", "safetensors", "sacrebleu", "matplotlib", "locust")


def _run(artifacts: Path, mode: str, timeout: float, python_path: str = "", **variables) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)  # seqserve and python, as on the image's PATH
    env = os.environ | {"PATH": bin_dir + os.pathsep + os.environ["PATH"], "SEQSERVE_ARTIFACTS": str(artifacts)}
    env |= {f"SEQSERVE_{k.upper()}": v for k, v in variables.items()}
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_path, os.environ.get("PYTHONPATH")]))
    return subprocess.run(["sh", str(SCRIPT), mode], capture_output=True, text=True, timeout=timeout, env=env)


def _serve_image_python(tmp_path: Path) -> str:
    """A PYTHONPATH entry on which the train and loadtest extras cannot be imported, as in the serve image."""
    blocked = tmp_path / "serve-image"
    blocked.mkdir()
    for name in SERVE_IMAGE_LACKS:
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is not in the serve image')\n")
    return str(blocked)


@pytest.fixture
def artifacts(tiny_checkpoint, tiny_bundle, tmp_path) -> Path:
    """A volume as a finished trainer left it, but not yet verified: checkpoint/, bundle/, built-with."""
    shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint")
    shutil.copytree(tiny_bundle, tmp_path / "bundle")
    (tmp_path / "bundle" / "verified.json").unlink(missing_ok=True)
    (tmp_path / "built-with").write_text("train:  | export: --int8\n")  # the defaults' arguments
    return tmp_path


def test_wait_blocks_until_the_bundle_is_verified_and_build_then_skips(artifacts, tmp_path_factory):
    serve_image = _serve_image_python(tmp_path_factory.mktemp("python"))  # `wait` runs in the serve image
    with pytest.raises(subprocess.TimeoutExpired) as waited:  # the server pods' init container keeps waiting
        _run(artifacts, "wait", timeout=6, python_path=serve_image)
    assert "waiting for a verified bundle" in (waited.value.stdout or b"").decode()
    verified = subprocess.run([sys.executable, "-m", "seqserve.cli", "verify", str(artifacts / "bundle"), "--quiet",
                               "--quality-n", "20"], capture_output=True, text=True, timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert is_verified(artifacts / "bundle")
    assert _run(artifacts, "wait", timeout=60, python_path=serve_image).returncode == 0
    files = {p: p.stat().st_mtime_ns for p in (artifacts / "bundle").iterdir()}
    skipped = _run(artifacts, "build", timeout=60)  # `docker compose up` again: the trainer exits at once
    assert skipped.returncode == 0 and "nothing to do" in skipped.stdout, skipped.stdout + skipped.stderr
    assert {p: p.stat().st_mtime_ns for p in (artifacts / "bundle").iterdir()} == files  # untouched


def test_other_training_arguments_start_over_and_a_failed_training_fails_the_trainer(artifacts):
    # A flag `seqserve train` refuses: the old bundle (built from other arguments) is gone, and the trainer exits
    # non-zero, so the servers (service_completed_successfully) never start on a bundle that does not match.
    failed = _run(artifacts, "build", timeout=120, train_args="--no-such-flag")
    assert failed.returncode != 0 and "--no-such-flag" in failed.stderr
    assert not (artifacts / "bundle").exists() and not (artifacts / "checkpoint" / "metrics.json").exists()
    assert (artifacts / "built-with").read_text() == "train: --no-such-flag | export: --int8\n"


def test_unknown_mode_is_refused(tmp_path):
    refused = _run(tmp_path, "serve", timeout=30)
    assert refused.returncode == 2 and "usage: seqserve-bundle build|wait" in refused.stderr
