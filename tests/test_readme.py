"""What a new user reads first says it once and says it right: how to enter the venv (then bare commands), the two
commands and how to shorten training, figures without counts that go stale, the apt line that works as root or
through sudo, `make gpu-check` without a GPU, and the compose command the tests run."""
from __future__ import annotations

import re
from pathlib import Path

from external_tools import PACKAGES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
ACTIVATE = ". .venv/bin/activate"


def _blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def _section(heading: str) -> str:
    start = README.index(f"\n## {heading}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def test_the_venv_is_entered_once_and_every_command_after_is_bare():
    assert README.count(ACTIVATE) == 1 and README.count(".venv/bin/") == 1, \
        [line for line in README.splitlines() if ".venv/bin/" in line]
    first_bare = min(README.index(block) for block in _blocks(README)
                     if re.search(r"^(seqserve|python|locust) ", block, re.M))
    assert README.index(ACTIVATE) < first_bare


def test_two_commands_are_two_and_make_serve_can_bound_training():
    section = _section("Two commands")
    commands = [line for line in _blocks(section)[0].splitlines() if line.strip()]
    assert [c.split("#")[0].split() for c in commands] == [["make", "serve"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    assert "TRAIN_MINUTES=" in section and re.search(r"^TRAIN_MINUTES \?=", makefile, re.M)
    assert "hours" in section  # what a busy machine costs without it


def test_no_count_that_goes_stale_with_the_next_test_or_check():
    assert not re.search(r"\b\d[\d,]* tests\b", README), re.findall(r".*\b\d[\d,]* tests\b.*", README)
    assert not re.search(r"\b\d+ checks passed\b", README)


def test_the_apt_line_works_as_root_and_says_sudo_for_a_user():
    line = next(line for block in _blocks(README) for line in block.splitlines() if "apt-get install" in line)
    assert not line.startswith("sudo ") and "sudo" in line.split("#", 1)[1]  # root has no sudo in a container
    assert set(PACKAGES.values()) <= set(line.split("#")[0].split())


def test_gpu_check_says_what_it_does_without_a_gpu():
    around = README[README.index("`make gpu-check` runs"):README.index("Nothing unfinished is served")]
    assert "no CUDA provider" in around and "exits 2" in around and "DEVICE=cpu" in around


def test_no_narration_of_how_a_figure_was_obtained():
    for phrase in ("not a controlled comparison", "the earlier engine", "smaller suite of", "measured on 2026"):
        assert phrase not in README, phrase


def test_compose_commands_are_the_v1_command_the_deploy_tests_run():
    for path in (ROOT / "README.md", ROOT / "docs" / "deploy.md", ROOT / "docker-compose.yml"):
        commands = [line for line in path.read_text().splitlines() if re.search(r"\bdocker compose \w", line)]
        assert all("Compose v2" in line or "v2 plugin" in line for line in commands), (path.name, commands)
    assert "Compose v1's `docker-compose`" in README
    assert 'require("docker-compose")' in (ROOT / "tests" / "deploy" / "test_compose_and_images.py").read_text()
