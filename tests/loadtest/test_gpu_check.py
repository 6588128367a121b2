"""`make gpu-check` in its quick CPU form, end to end on the tiny shared bundle: one markdown report whose every section
has its command, date, device and the provider in use; and the refusal on a machine without a CUDA provider."""
from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

from seqserve.loadtest import device_probe, gpu_check

ROOT = Path(__file__).resolve().parents[2]  # the inner pytest runs tests/server/... from the repository root
SECTIONS = {"1. Device and provider": "-m seqserve.loadtest.device_probe --device cpu",
            "2. Test suite on cpu": "SEQSERVE_TEST_DEVICE=cpu ",
            "3. Benchmark rows: engine, graph loop, transformers generate": "-m seqserve.cli.main bench --checkpoint ",
            "4. Step profile, fp32": "-m seqserve.loadtest.step_profile "}


def _sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## ", markdown, flags=re.M)[1:]
    return {part.splitlines()[0]: part for part in parts}


def test_the_quick_cpu_check_writes_every_section_with_its_command_date_and_provider(
        tiny_checkpoint, tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out, work = tmp_path / "gpu-check.md", tmp_path / "work"
    argv = ["--device", "cpu", "--quick", "--out", str(out), "--work", str(work), "--checkpoint",
            str(tiny_checkpoint), "--bundle", str(tiny_bundle)]
    assert gpu_check.main(argv) == 0
    markdown = out.read_text()
    assert markdown.startswith("# GPU check\n") and "**Every section passed** (exit status 0)." in markdown
    sections = _sections(markdown)
    assert list(sections) == list(SECTIONS)
    for title, command in SECTIONS.items():
        body = sections[title]
        fenced = body.split("Command:\n\n```\n", 1)[1].split("\n```", 1)[0]
        assert command in fenced, title
        date = re.search(r"^Date: (\S+)\. Device: CPU ", body, flags=re.M)
        assert date and datetime.datetime.fromisoformat(date.group(1)).tzinfo is not None, title
        assert "Provider in use: " in body and "CPUExecutionProvider" in body.split("Provider in use: ", 1)[1]
        assert "Exit status: 0 after " in body and "\nOutput:\n\n```\n" in body
    bench = sections[list(SECTIONS)[2]]
    assert "--device cpu --no-ctranslate2 --transformers" in bench
    assert "Provider in use: onnxruntime CPUExecutionProvider; transformers torch-cpu." in bench
    assert "tests/engine/runtime/test_device.py" in sections["2. Test suite on cpu"] and " passed" in sections[
        "2. Test suite on cpu"]
    rows = {r["name"]: r for r in json.loads((work / "bench.json").read_text())["rows"]}
    forced = gpu_check.QUICK_TOKENS
    assert rows["transformers-marian fp32 b2"]["output_lengths"] == [forced, forced]
    assert "| Step profile, fp32 | 0 |" in markdown
    assert "provider: CPUExecutionProvider" in sections["1. Device and provider"]


def test_without_a_cuda_provider_the_check_says_so_names_why_and_exits_non_zero(tmp_path, capsys):
    try:
        device_probe.provider("cuda")
    except RuntimeError:
        pass
    else:
        pytest.skip("this machine has a CUDA provider")
    out = tmp_path / "gpu-check.md"
    assert gpu_check.main(["--device", "cuda", "--out", str(out), "--work", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA provider (--device cuda)" in err and "--device cuda: onnxruntime" in err
    markdown = out.read_text()
    assert "**no CUDA provider**: the check stopped before its other sections" in markdown
    assert "make gpu-check DEVICE=cpu" in markdown and list(_sections(markdown)) == ["1. Device and provider"]
    assert "no CUDA provider: --device cuda: onnxruntime" in markdown  # the probe's own reason, in its output


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint", "c", "--bundle", "b"], "--checkpoint and --bundle are for --quick"),
    (["--quick", "--checkpoint", "c"], "--checkpoint and --bundle go together"),
    (["-n", "0"], "-n must be between 1 and 100000"),
    (["--section-timeout", "0"], "--section-timeout must be between 1 and 86400"),
])
def test_bad_settings_are_refused_naming_the_option(argv, message, capsys):
    assert gpu_check.main(argv) == 2
    assert message in capsys.readouterr().err
