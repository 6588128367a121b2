"""The shared-fixture builder: a build that fails or runs past its budget is reported naming the fixture (and what
depends on it), and a directory whose last-written file exists counts as built."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import fixture_builds as fb
import pytest


@dataclass(frozen=True)
class Scripted(fb.Build):
    """A build that runs a given Python snippet instead of training or exporting."""

    code: str = ""

    def command(self, out: Path, needed: Path | None) -> list[str]:
        return [sys.executable, "-c", self.code, str(out)]


def _artifacts(monkeypatch, tmp_path, **builds) -> fb.SharedArtifacts:
    monkeypatch.setattr(fb, "BUILDS", builds)
    monkeypatch.setattr(fb, "KEEP", None)
    return fb.SharedArtifacts(scratch=tmp_path)


def test_a_failed_build_names_the_fixture_and_its_dependents(monkeypatch, tmp_path):
    failing = Scripted("training the model", "ckpt", "metrics.json", None, True,
                       code="import sys; print('loss is nan'); sys.exit(3)")
    after = Scripted("exporting it", "bundle", "manifest.json", "model", True, code="")
    artifacts = _artifacts(monkeypatch, tmp_path, model=failing, bundle=after)
    with pytest.raises(fb.BuildFailed) as exc:
        artifacts.get("model", report=lambda line: None)
    assert "training the model for the shared fixture model failed with exit code 3" in str(exc.value)
    assert "loss is nan" in str(exc.value)  # the build's own output says why
    with pytest.raises(fb.BuildFailed, match="shared fixture bundle needs model, which could not be built"):
        artifacts.get("bundle", report=lambda line: None)


def test_a_build_past_its_budget_is_stopped_and_named(monkeypatch, tmp_path):
    monkeypatch.setattr(fb, "BUILD_TIMEOUT_S", 1.0)
    slow = Scripted("training the model", "ckpt", "metrics.json", None, True, code="import time; time.sleep(60)")
    artifacts = _artifacts(monkeypatch, tmp_path, model=slow)
    with pytest.raises(fb.BuildFailed, match=r"shared fixture model timed out \(SEQSERVE_TEST_BUILD_TIMEOUT=1 s\)"):
        artifacts.get("model", report=lambda line: None)


def test_a_build_counts_only_once_its_last_file_is_written(monkeypatch, tmp_path):
    code = "import pathlib, sys; out = pathlib.Path(sys.argv[1]); (out / 'metrics.json').write_text('{}')"
    partial = Scripted("training the model", "ckpt", "metrics.json", None, True,
                       code="import pathlib, sys; (pathlib.Path(sys.argv[1]) / 'model.safetensors').write_text('')")
    artifacts = _artifacts(monkeypatch, tmp_path, model=partial)
    with pytest.raises(fb.BuildFailed, match="model exited 0 but wrote no metrics.json"):
        artifacts.get("model", report=lambda line: None)
    artifacts = _artifacts(monkeypatch, tmp_path, model=Scripted("training", "ckpt", "metrics.json", None, True,
                                                                 code=code))
    lines: list[str] = []
    assert artifacts.get("model", report=lines.append) == tmp_path / "ckpt"
    assert artifacts.get("model", report=lines.append) == tmp_path / "ckpt"  # built once per session
    assert len([line for line in lines if "built in" in line]) == 1
