"""The README and docs say what the product does, and what they show works: every relative link resolves (anchors
included), no doc narrates how it was made, the web UI command stays on this machine, the commands offered in place
of grpcurl and the client snippet run against a real server."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format

from seqserve.client.client import Client
from seqserve.v1 import seqserve_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(ROOT / name for name in subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                                                     text=True, check=True).stdout.split())
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NARRATION = re.compile(r"\b(this|that|an? earlier|earlier|another|previous|one) sessions?\b"
                       r"|\bissues? \d|\bthe issue'?s?\b|\bbefore this change\b|\bnot run here\b|\bwas built on\b"
                       r"|\bthis tree\b|\bnot rerun\b|\ba lent\b|\bthis project's\b|\b(it|that|this) was stopped\b"
                       r"|\bbuilt or run here\b|\bdevelopment machine\b|\bthe seeds'", re.I)


def _prose(text: str) -> str:
    """The text as rendered prose: fenced blocks and inline code (where a link is not a link) removed."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def _block(after: str, language: str = "sh") -> str:
    """The first fenced block of README that follows the text `after`."""
    start = README.index(f"```{language}\n", README.index(after)) + len(language) + 4
    return README[start:README.index("```", start)]


def test_docs_are_found():
    assert {p.relative_to(ROOT).as_posix() for p in DOCS} >= {"README.md", "docs/deploy.md", "docs/benchmarks.md"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_from_the_file_that_holds_it(doc):
    broken = []
    for target in LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_describe_the_product_not_how_it_was_made(doc):
    text = doc.read_text()
    assert not NARRATION.findall(text), [line for line in text.splitlines() if NARRATION.search(line)]
    assert "For README" not in text  # a draft meant for another file


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_examples_use_the_default_models_inputs(doc):
    # `b 5 9 k` is the tests' tiny model's format, outside the default model's domain
    assert not re.search(r"\bb 5 9\b", doc.read_text())


def test_the_web_ui_command_binds_this_machine_only():
    sources = [*DOCS, ROOT / "loadtest" / "locustfile.py"]
    commands = [line for doc in sources for line in doc.read_text().replace("\\\n", " ").splitlines()
                if re.search(r"\blocust -f ", line) and "--headless" not in line]
    assert len(commands) >= 3 and all("--web-host 127.0.0.1" in c for c in commands), commands


def test_grpcurl_says_where_to_get_it_and_what_to_use_instead():
    around = README[README.index("With `grpcurl`"):README.index("Errors are gRPC status codes")]
    assert "Debian has no grpcurl package" in around
    assert "https://github.com/fullstorydev/grpcurl/releases" in around
    assert "go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest" in around


def test_the_commands_offered_instead_of_grpcurl_work(served):
    venv_bin = str(Path(sys.executable).parent) + "/"  # what `. .venv/bin/activate` puts first on PATH
    commands = [shlex.split(line.replace("localhost:50051", served.address), comments=True)
                for line in _block("without grpcurl:").splitlines() if line.strip()]
    assert [c[0] for c in commands] == ["python", "seqserve", "python"]
    commands = [[venv_bin + c[0], *c[1:]] for c in commands]
    outputs = []
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs.append(done.stdout)
    services, generated, health = outputs
    generation = pb.DESCRIPTOR.services_by_name["Generation"]
    assert {f"{generation.full_name}/{m.name}" for m in generation.methods} <= set(services.split())
    assert {"grpc.health.v1.Health/Check", "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"} <= \
        set(services.split())
    response = json_format.Parse(generated, pb.GenerateResponse())
    with Client(served.address, timeout=30) as client:
        assert response.text == client.generate("<es> 1681").text and response.usage.generated_tokens > 0
    assert health == "SERVING\n"


def test_the_client_snippet_ends_its_stream_with_a_newline(served):
    snippet = _block("the load test's flags.", "python")
    assert re.search(r"^    for piece in client\.stream\(.*\n        print\(.*end=\"\".*\n    print\(\)", snippet, re.M)
    done = subprocess.run([sys.executable, "-c", snippet.replace("127.0.0.1:50051", served.address)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with Client(served.address, timeout=30) as client:
        streamed = client.generate("<fr> 144 146").text  # a stream says what the unary call returns
        best = client.generate("<en> 2024-03-05", num_beams=4, num_return_sequences=4, return_logprobs=True)
    lines = done.stdout.splitlines()
    assert lines[1] == streamed and lines[2].startswith(best.sequences[0].text + " ") and len(lines) == 6


def test_the_readme_lists_the_families_seqserve_import_reads():
    """README's family list is the import's own table (model/hf_families.py), as `seqserve import --help` prints it."""
    from seqserve.model.hf_families import described

    assert f"by `model_type`: {described()}." in " ".join(README.split())
