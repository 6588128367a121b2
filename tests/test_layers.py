"""The package's layers, read from the source with ast (nothing is imported or executed).

    cli                                   the command line: may import any layer, lazily per subcommand
    checks, loadtest                      need PyTorch and the engine together (verify, parity, quality, bench);
                                          loadtest reaches a running server through client, and only its
                                          engine-offline modules import server
    export                                checkpoint -> bundle: model + contract
    model (torch)   server (onnxruntime)  independent of each other; server takes only client's shared conventions
                    client (grpc)         the client of a running server: no onnxruntime, no engine
    contract, v1                          the bundle contract and the generated gRPC code: import nothing of ours

docs/architecture.md draws the same picture; this test is what keeps it true.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"contract": "contract", "model": "model", "client": "client", "engine": "engine", "server": "server", "export": "export",
           "checks": "checks", "loadtest": "loadtest", "cli": "cli", "v1": "protos/seqserve/v1"}
ALLOWED = {  # package -> the packages it may import
    "v1": set(),
    "contract": set(),
    "model": {"contract"},
    "client": {"contract", "v1"},
    "engine": {"contract"},
    "server": {"contract", "v1", "client", "engine"},
    "export": {"contract", "model"},
    "checks": {"contract", "model", "engine", "server", "export"},
    "loadtest": {"contract", "model", "client", "engine", "server", "export", "v1"},
    "cli": {"contract", "model", "client", "engine", "server", "export", "checks", "loadtest", "v1"},
}
# What of the client the server takes: the conventions both ends of a call share (the default port, a field's flag
# name, boolean words; the bearer token's metadata key and scheme). Never the generation client or the commands.
SERVER_FROM_CLIENT = {"seqserve.client.flags", "seqserve.client.channel"}
# What of the engine the gRPC edge's calls take: its narrow interface and the value types it carries. Only
# server/loading.py, which builds an engine, reaches further (engine/build.py and the configs build takes).
EDGE_FROM_ENGINE = {"seqserve.engine.limits", "seqserve.engine.api", "seqserve.engine.request"}
EDGE_CALL_PATH = {f"seqserve.server.{m}" for m in ("app", "service", "served_model", "inflight", "outbox",
                                                     "engine_metrics", "options", "responses", "pipe")}
# The loadtest modules that run the engine or the edge's own steps in their own process, without gRPC: every
# benchmark row (the offline engine row server_bench compares the gRPC path against included), the graph-loop row,
# the engine, node and step profilers, the provider probe, and the edge's per-call steps. Every other loadtest module
# (locustfile, grpc_user, driver, command, sweep, ...) talks to a running server and reaches it only through
# seqserve.client.
ENGINE_OFFLINE = {"seqserve.loadtest.bench_rows", "seqserve.loadtest.graph_loop", "seqserve.loadtest.engine_profile",
                  "seqserve.loadtest.node_profile", "seqserve.loadtest.step_profile", "seqserve.loadtest.device_probe",
                  "seqserve.loadtest.edge_calls"}
# What a load generator process loads (`locust -f locustfile.py`, `seqserve loadtest`): none of it may reach the
# server package, even through another loadtest module.
LOAD_GENERATORS = ("seqserve.loadtest.locustfile", "seqserve.loadtest.command")
# Imports of our own modules inside a function are allowed only where they keep a heavy or optional library out of a
# process: the CLI (`serve` never loads torch), a benchmark row (each row's process loads only its own backend), and
# the benchmark's CTranslate2 converter (ctranslate2 is an optional extra). File -> modules it may import lazily.
LAZY_ALLOWED = {"cli/main.py": ("seqserve.",), "loadtest/bench_rows.py": ("seqserve.",),
                "loadtest/bench.py": ("seqserve.export.ctranslate2",)}


def _modules() -> dict[str, Path]:
    """Dotted module name (seqserve.<package>.<module>) -> file."""
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            stem = "".join(f".{p}" for p in parts if p != "__init__")
            found[f"seqserve.{package}{stem}"] = path
    return found


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported seqserve module, whether the import is inside a function or class body)."""
    tree = ast.parse(path.read_text(), str(path))
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              for n in ast.walk(f) if n is not f}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(n, id(node) in nested) for n in names if n.split(".")[0] == "seqserve"]
    return out


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else None


MODULES = _modules()
GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def test_the_tree_is_what_this_test_reads():
    assert len(MODULES) > 60 and {"seqserve.engine.step.engine", "seqserve.contract.manifest", "seqserve.cli.main",
                                  "seqserve.v1.seqserve_pb2"} <= set(MODULES)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(package):
    wrong = sorted({f"{m} imports {target}" for m, imports in GRAPH.items() if _package(m) == package
                    for target, _ in imports
                    if _package(target) not in (package, None) and _package(target) not in ALLOWED[package]
})
    assert not wrong, "\n".join(wrong)


def _server_imports_outside(modules: dict[str, list[tuple[str, bool]]], package: str,
                            allowed: set[str]) -> list[str]:
    """`m imports t` for each module m of package outside `allowed` that imports anything of seqserve.server or
    seqserve.engine."""
    return sorted({f"{m} imports {t}" for m, imports in modules.items() if _package(m) == package and m not in allowed
                   for t, _ in imports if _package(t) in ("server", "engine")})


def test_the_server_takes_only_the_shared_conventions_from_the_client():
    wrong = sorted({f"{m} imports {t}" for m, imports in GRAPH.items() if _package(m) == "server"
                    for t, _ in imports if _package(t) == "client" and not t.startswith(tuple(SERVER_FROM_CLIENT))})
    assert not wrong, "\n".join(wrong)


def _edge_engine_imports(modules: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """`m imports t` for each module m of EDGE_CALL_PATH that imports anything of the engine but EDGE_FROM_ENGINE."""
    return sorted({f"{m} imports {t}" for m, imports in modules.items() if m in EDGE_CALL_PATH
                   for t, _ in imports if _package(t) == "engine" and ".".join(t.split(".")[:3]) not in
                   EDGE_FROM_ENGINE})


def test_the_edge_talks_to_an_engine_only_through_its_interface():
    """The service and everything a call goes through import only engine/api.py and engine/request.py: never the
    scheduler, the runner, the Engine or its in-process core."""
    assert EDGE_CALL_PATH <= set(MODULES), sorted(EDGE_CALL_PATH - set(MODULES))
    wrong = _edge_engine_imports(GRAPH)
    assert not wrong, "\n".join(wrong)
    bad = {"seqserve.server.service": [("seqserve.engine.api", False),
                                       ("seqserve.engine.step.scheduler.QueueFull", False)],
           "seqserve.server.loading": [("seqserve.engine.build", False)]}
    assert _edge_engine_imports(bad) == ["seqserve.server.service imports seqserve.engine.step.scheduler.QueueFull"]


def test_only_the_engine_offline_loadtest_modules_import_the_server():
    assert ENGINE_OFFLINE <= set(MODULES), sorted(ENGINE_OFFLINE - set(MODULES))
    wrong = _server_imports_outside(GRAPH, "loadtest", ENGINE_OFFLINE)
    assert not wrong, "\n".join(wrong)


def _closure(module: str) -> set[str]:
    """Every module of ours that importing `module` loads (imports at module level, followed transitively)."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen and m in GRAPH:
            seen.add(m)
            todo += [t for t, nested in GRAPH[m] if not nested]
    return seen


@pytest.mark.parametrize("entry", LOAD_GENERATORS)
def test_a_load_generator_loads_nothing_of_the_server(entry):
    loaded = _closure(entry)
    assert "seqserve.client.channel" in loaded  # the closure is followed (it reaches the client's connection flags)
    assert not sorted(m for m in loaded if _package(m) in ("server", "engine"))


def test_no_import_is_hidden_inside_a_function():
    hidden = sorted({f"{MODULES[m].relative_to(ROOT)} imports {t}" for m, imports in GRAPH.items()
                     for t, nested in imports
                     if nested and not t.startswith(LAZY_ALLOWED.get(str(MODULES[m].relative_to(ROOT)), ("-",)))})
    assert not hidden, "\n".join(hidden)


def test_the_module_graph_has_no_cycle():
    edges = {m: sorted({t for t, _ in imports if t in MODULES and t != m}) for m, imports in GRAPH.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in edges[m]:
            if state.get(t) == 1:
                return path + [m, t]
            if t not in state and (cycle := visit(t, path + [m])):
                return cycle
        state[m] = 2
        return None

    for m in edges:
        if m not in state and (cycle := visit(m, [])):
            pytest.fail("import cycle: " + " -> ".join(cycle[cycle.index(cycle[-1]):]))


def test_the_checker_catches_what_it_forbids(tmp_path):
    """The rules bite: a server module importing model, and a cycle, are both reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from seqserve.model.train import train\n\ndef f():\n    from seqserve.export import bundle\n")
    imports = _imports(bad)
    assert ("seqserve.model.train", False) in imports and ("seqserve.export.bundle", True) in imports
    assert _package("seqserve.model.train") not in ALLOWED["server"]


def test_the_loadtest_rule_catches_a_client_side_module_importing_the_server():
    """locustfile importing the engine is reported; the same import from a benchmark row is not."""
    imports = [("seqserve.engine.step.engine", False)]
    graph = {"seqserve.loadtest.locustfile": imports, "seqserve.loadtest.bench_rows": imports}
    assert _server_imports_outside(graph, "loadtest", ENGINE_OFFLINE) == [
        "seqserve.loadtest.locustfile imports seqserve.engine.step.engine"]


# The engine's rooms (docs/architecture.md "The engine's rooms"): engine/ holds the interface and the types the rooms
# share (api, request, build, limits, step_output); step/ may import every room; the others only what is listed.
ROOM_ALLOWED = {
    "runtime": {"runtime"},
    "decoding": {"decoding"},
    "remote": {"remote"},
    "step": {"step", "decoding", "runtime"},
}
SHARED = {f"seqserve.engine.{m}" for m in ("api", "request", "build", "limits", "step_output")}
# Crossings the rooms still make, each with its reason; a new one fails the test, a removed one only shrinks this.
KNOWN_CROSSINGS = {
    "seqserve.engine.decoding.beam imports seqserve.engine.runtime.runner",  # Beams reads runner.slots to place beams
    "seqserve.engine.decoding.sampling imports seqserve.engine.step.running",  # Sampler.choose reads a Running row
    "seqserve.engine.remote.engine_process imports seqserve.engine.step.core",  # the host holds the in-process client
}
def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engine" and parts[2] in ROOM_ALLOWED else None


def _room_crossings(graph: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """`m imports t` for each import from one room of the engine into a room it may not import, or into a file of
    engine/ that is not SHARED."""
    wrong = set()
    for m, imports in graph.items():
        if (room := _room(m)) is None:
            continue
        for t, _ in imports:
            if _package(t) != "engine" or t == "seqserve.engine":
                continue
            target = ".".join(t.split(".")[:4 if _room(t) else 3])
            if _room(t) in ROOM_ALLOWED[room] or target in SHARED:
                continue
            wrong.add(f"{m} imports {target}")
    return sorted(wrong)


def test_each_room_imports_only_the_rooms_it_may():
    """runtime imports no decoding, decoding no runtime, remote only the interface; step composes them."""
    assert {r for m in MODULES if (r := _room(m))} == set(ROOM_ALLOWED)
    assert sorted(set(_room_crossings(GRAPH)) - KNOWN_CROSSINGS) == []


def test_the_engine_process_imports_nothing_of_the_server():
    """Its starter hands it the model's Limits (Launch): the engine resolves no server settings itself."""
    wrong = sorted({f"{m} imports {t}" for m, imports in GRAPH.items() if _package(m) == "engine"
                    for t, _ in imports if _package(t) == "server"})
    assert not wrong, "\n".join(wrong)


def test_the_room_rule_catches_a_runtime_module_importing_decoding():
    bad = {"seqserve.engine.runtime.runner": [("seqserve.engine.decoding.beam.Beams", False),
                                              ("seqserve.engine.step_output", False)]}
    assert _room_crossings(bad) == ["seqserve.engine.runtime.runner imports seqserve.engine.decoding.beam"]
