"""The wheel installs one package: only `seqserve/` and its `.dist-info` land in site-packages, and the installed
`seqserve` script and `python -m seqserve.client.healthcheck` run from there."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Not sources: what a build, the venv, the tests or a run leave in the working tree.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "artifacts", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".ruff_cache", "reports", "runs")
# One module from every subpackage the package-dir mapping installs, plus the generated stubs.
EXPECTED = ["seqserve/__init__.py", "seqserve/protogen.py", "seqserve/v1/seqserve_pb2.py", "seqserve/contract/names.py",
            "seqserve/model/train.py", "seqserve/server/app.py", "seqserve/export/bundle.py",
            "seqserve/checks/verify.py", "seqserve/loadtest/bench.py", "seqserve/cli/main.py",
            "seqserve/client/healthcheck.py", "seqserve/engine/step/engine.py", "seqserve/engine/decoding/beam.py",
            "seqserve/engine/runtime/runner.py", "seqserve/engine/remote/engine_process.py"]


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel . --no-deps` of a copy of the sources (the build leaves build/ and *.egg-info where it runs)."""
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, work / "src", ignore=NOT_SOURCES)
    # --no-build-isolation: the build uses this venv's setuptools instead of downloading one.
    _run([sys.executable, "-m", "pip", "wheel", work / "src", "--no-deps", "--no-build-isolation", "-q",
          "-w", work / "dist"])
    (built,) = (work / "dist").glob("seqserve-*.whl")
    return built


def test_the_wheel_holds_only_the_seqserve_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = [t for t in tops if t.endswith(".dist-info")]
    assert tops == {"seqserve", *dist_info} and len(dist_info) == 1 and dist_info[0].startswith("seqserve-")
    assert set(EXPECTED) <= set(names)
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info[0]}/entry_points.txt").decode()
    assert "seqserve = seqserve.cli.main:main" in entry_points


def test_installed_into_a_fresh_venv_it_adds_only_seqserve_and_runs(wheel, tmp_path):
    fresh = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", fresh])
    python = fresh / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    before = set(os.listdir(site))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel])
    added = set(os.listdir(site)) - before
    assert {name for name in added if not name.endswith(".dist-info")} == {"seqserve"}
    assert len(added) == 2 and any(n.startswith("seqserve-") and n.endswith(".dist-info") for n in added)
    # The dependencies come from this venv's site-packages (PYTHONPATH does not read its .pth files, so the
    # editable install of the working tree stays out): seqserve itself is the installed copy.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    where = _run([python, "-c", "import seqserve.cli.main as m; print(m.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(site)
    usage = _run([fresh / "bin" / "seqserve", "--help"], env=env, cwd=tmp_path).stdout
    assert all(command in usage for command in ("train", "export", "verify", "serve", "generate", "bench"))
    usage = _run([python, "-m", "seqserve.client.healthcheck", "--help"], env=env, cwd=tmp_path).stdout
    assert "host:port" in usage
