"""What a user sees with an imported Hugging Face model, through the real `seqserve` command: `import --quiet` prints
no transformers progress bar, `export` says in words why it measured no quality, and a plain `generate` on a model
whose default is beam search prints the text, not the n-best. `seqserve --help` lists every family the import reads."""
from __future__ import annotations

import os
import subprocess
import sys

import hf_fixtures
import pytest

from seqserve.cli.main import build_parser, main
from seqserve.client.client import Client
from seqserve.model.hf_families import FAMILIES

pytest.importorskip("transformers")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seqserve.cli", *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(import's run, export's run, a server of the bundle) for a tiny Marian (generation_config: num_beams 4)."""
    from grpc_harness import Served

    root = tmp_path_factory.mktemp("marian")
    hf_dir = hf_fixtures.build_marian(root / "hf")
    imported = _cli("import", str(hf_dir), "--out", str(root / "checkpoint"), "--quiet")
    assert imported.returncode == 0, imported.stderr
    exported = _cli("export", str(root / "checkpoint"), "--out", str(root / "bundle"), "--quiet")
    assert exported.returncode == 0, exported.stderr
    server = Served(root / "bundle").wait_ready()
    yield imported, exported, server
    server.stop()


def test_import_quiet_prints_no_progress_bar_of_transformers(imported):
    run, _, _ = imported
    assert "Loading weights" not in run.stderr and "%|" not in run.stderr, run.stderr
    assert "max |logits" in run.stdout or "PyTorch vs transformers" in run.stdout  # the comparison did run


def test_export_says_what_it_measured_on_an_imported_model(imported):
    """No held-out pairs: the probe strings' teacher forcing (finite logits; a variant's top-1 agreement)."""
    _, run, _ = imported
    assert "fp32: finite logits on 64 probe strings" in run.stdout.splitlines()
    assert "{" not in run.stdout  # no Python dict


def test_a_plain_generate_prints_the_text_of_a_default_beam_model(imported, capsys):
    _, _, server = imported
    source = next(s for s in hf_fixtures.real_strings() if len(s.split()) > 3)
    with Client(server.address, timeout=60) as client:
        expected = client.generate(source)
    assert expected.sequences[0].score is not None  # the model's default is beam search (scored hypotheses)
    assert main(["generate", source, "--server", server.address]) == 0
    assert capsys.readouterr().out == expected.text + "\n"


def test_help_lists_every_family_the_import_reads():
    parser = build_parser()
    text = parser.format_help() + parser._subparsers._group_actions[0].choices["import"].format_help()
    text = " ".join(text.split())  # argparse wraps lines
    assert all(name in text for name in FAMILIES) and "NLLB" in text and "M2M100" in text
