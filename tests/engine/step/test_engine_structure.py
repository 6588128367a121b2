"""The engine's shape, as docs/architecture.md describes it: collaborators composed rather than inherited, one writer
of what goes back, a runner that sees ids and slot arrays only, a Request that stores its result once, and small
files."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import seqserve.engine
from seqserve.engine.request import Request, RequestStatus, SamplingParams
from seqserve.engine.step.running import Running

ENGINE = Path(seqserve.engine.__file__).parent
MAX_LINES = 300
# The in-process engine: every room but remote/ (the process boundary, which came from server/).
FILES = sorted(f for f in ENGINE.rglob("*.py") if "remote" not in f.relative_to(ENGINE).parts)


def _tree(name: str | Path) -> ast.Module:
    return ast.parse((name if isinstance(name, Path) else next(ENGINE.rglob(name))).read_text())


def test_no_engine_class_inherits_from_another_engine_class():
    own = {node.name for f in FILES for node in ast.walk(_tree(f)) if isinstance(node, ast.ClassDef)}
    inherited = [(f.name, node.name, base.id) for f in FILES for node in ast.walk(_tree(f))
                 if isinstance(node, ast.ClassDef) for base in node.bases
                 if isinstance(base, ast.Name) and base.id in own]
    assert inherited == []


def test_only_outputs_py_builds_events_and_results():
    builders = sorted({f.name for f in FILES for node in ast.walk(_tree(f))
                       if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                       and node.func.id in ("Output", "Result", "Sequence", "TokenLogprob")})
    assert builders == ["outputs.py"]


def test_the_runner_and_the_slots_never_see_a_request():
    for name in ("runner.py", "slots.py"):
        imported = [a.name for node in ast.walk(_tree(name)) if isinstance(node, ast.ImportFrom)
                    for a in node.names]
        assert "Request" not in imported, name
    slots = [node for node in ast.walk(_tree("slots.py")) if isinstance(node, ast.ClassDef) and node.name == "Slots"]
    assert "bos_id" not in ast.unparse(slots[0])  # it holds the decoder start id, and says so


def test_a_request_stores_its_result_once_and_a_record_does_not_pose_as_one():
    stored = {f.name for f in dataclasses.fields(Request)}
    assert not stored & {"output_ids", "sequences", "text", "finish_reason", "error", "cross", "rng"}
    r = Request([5], SamplingParams())
    with pytest.raises(AttributeError):
        r.output_ids = [1]  # derived from the result: nothing to keep in step
    assert not {"params", "forced_bos"} & set(dir(Running))
    assert [s.name for s in RequestStatus] == ["WAITING", "RUNNING", "FINISHED"]  # encoded is not a status


def test_no_engine_file_is_over_300_lines():
    assert {f.name: n for f in FILES if (n := len(f.read_text().splitlines())) > MAX_LINES} == {}


def _calls(attr: str) -> list[tuple[str, str, str]]:
    """(file, function, what it is called on) for every call of `<something>.attr(...)` in the engine."""
    return sorted({(f.name, fn.name, ast.unparse(node.func.value)) for f in FILES
                   for fn in ast.walk(_tree(f)) if isinstance(fn, ast.FunctionDef)
                   for node in ast.walk(fn) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == attr})


def test_a_request_that_ended_leaves_in_one_place():
    """Engine._retire alone frees a request's rows and tells the scheduler; the scheduler's own retire is its books
    (the aborts and deadlines it drains)."""
    assert _calls("retire") == [("engine.py", "_retire", "self.runner"), ("engine.py", "_retire", "self.scheduler"),
                                ("scheduler.py", "_abandon", "self")]


def test_a_step_returns_its_report_and_nothing_else_carries_outputs_back():
    """No sink, no per-step callback: Engine.step returns the StepReport the loop hands to deliver."""
    source = "\n".join(f.read_text() for f in FILES)
    assert [w for w in ("Sink", "NO_SINK", "on_step", "flush(", "_Outputs") if w in source] == []
    step = [fn for fn in ast.walk(_tree("engine.py")) if isinstance(fn, ast.FunctionDef) and fn.name == "step"]
    assert ast.unparse(step[0].returns) == "StepReport"


def test_checks_and_loadtest_make_their_engines_through_the_one_offline_entry():
    """engine/build.py `offline` (which always sets the model's cross_bytes_per_token): no hand-built Engine or
    Scheduler outside the engine."""
    built = sorted(f"{f.parent.name}/{f.name}" for folder in ("checks", "loadtest")
                   for f in (ENGINE.parent / folder).glob("*.py")
                   for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Name) and node.func.id in ("Engine", "Scheduler"))
    assert built == []
    offline_users = {f.name for folder in ("checks", "loadtest") for f in (ENGINE.parent / folder).glob("*.py")
                     if "offline(" in f.read_text()}
    assert {"quality.py", "bench_rows.py", "engine_profile.py", "node_profile.py"} <= offline_users
