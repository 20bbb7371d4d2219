"""The package's shape (docs/architecture.md): no import cycles, one place that knows model_type strings, tools that
are thin, a registry whose entries agree with their classes, and a wheel that installs its commands and builds its op.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "paddle_vha")
EXPERIMENTS = os.path.join(ROOT, "tools", "experiments")  # run from the checkout, never installed
EXPERIMENT_TOOLS = {"quickstart", "study", "uptrain_study", "lr_study"}


def _modules(top=PKG):
    """{dotted module name: path} of every module of the package (or of another folder of modules: tools/experiments)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def import_graph(top=PKG):
    """module -> modules of the package it imports, anywhere in its code (module level or inside functions)."""
    mods = _modules(top)
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        is_pkg = path.endswith("__init__.py")
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # the module itself for `from pkg.mod import name`
                    t = t.rpartition(".")[0]
                if t and t != m:
                    graph[m].add(t)
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_has_no_cycles():
    graph = import_graph()
    assert "paddle_vha.families" in graph and "paddle_vha.vha.spec" in graph["paddle_vha.families"]  # it sees edges
    found = cycles(graph)
    print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} import edges, cycles: {found}")
    assert not found, f"import cycles: {found}"


def test_experiments_import_graph_has_no_cycles():
    """tools/experiments too (round 4: real_model_study, real_cost and real_report imported each other; what they
    share is real_plan.py now)."""
    graph = import_graph(EXPERIMENTS)
    assert "tools.experiments.real_plan" in graph["tools.experiments.real_report"]  # it sees relative imports
    found = cycles(graph)
    print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} import edges, cycles: {found}")
    assert not found, f"import cycles: {found}"


def folder(module: str) -> str:
    """The unit a module belongs to: its top-level folder under paddle_vha/ ('vha', 'checkpoint', ...), or itself
    for a top-level module ('families', 'accounting')."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def folder_graph(graph=None):
    """folder -> folders it imports from (any module of one importing any module of the other)."""
    graph = graph or import_graph()
    out = {}
    for m, targets in graph.items():
        out.setdefault(folder(m), set()).update(folder(t) for t in targets if folder(t) != folder(m))
    out.pop("__init__", None)  # paddle_vha/__init__.py re-exports the public names: above everything
    for targets in out.values():
        targets.discard("__init__")
    return out


def test_folder_graph_is_acyclic():
    """Layers, not only modules: no two folders import each other, directly or through others (checkpoint and spec at
    the bottom; the base, the variants, the registry; the stages; cli on top)."""
    graph = folder_graph()
    assert "spec" in graph["vha"] and "checkpoint" in graph["families"]  # it sees edges
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    found = cycles(graph)
    order = []  # bottom-up: a folder after everything it imports
    while len(order) < len(graph) and not found:
        order += sorted(f for f in graph if f not in order and graph[f] <= set(order))
    print("folders bottom-up:", " < ".join(order), "| cycles:", found)
    assert not found, f"folders that import each other: {found}"


def test_only_cli_exits_the_process():
    """Library code raises exceptions; only paddle_vha/cli/ turns them into an exit status (and nothing below it
    imports it)."""
    hits = []
    for m, path in _modules().items():
        if folder(m) == "cli":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("exit", "_exit") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("sys", "os"):
                hits.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Raise) and "SystemExit" in ast.dump(node):
                hits.append(f"{path}:{node.lineno}")
    below = [m for m, targets in import_graph().items() if folder(m) not in ("cli", "__init__")
             and any(folder(t) == "cli" for t in targets)]
    assert not hits, f"process exits outside paddle_vha/cli/: {hits}"
    assert not below, f"modules below the command lines that import them: {below}"


def test_no_family_branches_in_shared_code():
    """Shared code asks the registry and the specs; it never branches on a model_type or an attention kind
    (`x.model_type == ...`, `x.kind in (...)`): those decisions live in the family folders."""
    families = ("vha", "mea", "qwen3", "shared_kv", "moe", "moe_vha", "llama", "qwen2")
    hits = []
    for m, path in _modules().items():
        if folder(m) in families or m == "paddle_vha.families":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names = [n.attr for n in sides if isinstance(n, ast.Attribute)  # cfg.model_type, arch.kind
                         and not (isinstance(n.value, ast.Attribute) and n.value.attr == "dtype")]  # numpy's dtype.kind
                literal = any(isinstance(n, ast.Constant) and isinstance(n.value, str) or isinstance(
                    n, (ast.Tuple, ast.List, ast.Set)) and any(isinstance(e, ast.Constant) for e in n.elts) for n in sides)
                if literal and any(n in ("kind", "model_type") for n in names):  # against a named family or kind
                    hits.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    print(f"kind / model_type comparisons outside the family folders: {hits}")
    assert not hits, hits


def _model_types():
    from paddle_vha.families import FAMILIES

    return set(FAMILIES)


ALLOWED = ("paddle_vha/families.py", "paddle_vha/vha/", "paddle_vha/mea/", "paddle_vha/qwen3/", "paddle_vha/shared_kv/",
           "paddle_vha/moe/", "paddle_vha/moe_vha/", "paddle_vha/sinks/", "paddle_vha/llama/", "paddle_vha/qwen2/")


def test_model_type_strings_live_in_the_registry_and_family_folders():
    """No shared module or tool picks a family by a model_type string: they ask paddle_vha.families."""
    types = _model_types()
    files = [p for p in _modules().values()] + [os.path.join(ROOT, "tools", f) for f in os.listdir(os.path.join(ROOT, "tools"))
                                                if f.endswith(".py")]
    files += [os.path.join(EXPERIMENTS, f) for f in os.listdir(EXPERIMENTS) if f.endswith(".py")]
    hits = []
    for path in files:
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Constant) and node.value in types:
                hits.append((rel, node.lineno, node.value))
    outside = [h for h in hits if not h[0].startswith(ALLOWED)]
    print(f"{len(hits)} model_type literals, in: {sorted({h[0] for h in hits})}")
    assert any(h[0] == "paddle_vha/families.py" for h in hits)  # the scan sees literals where they are
    assert not outside, f"model_type literals outside the registry and family folders: {outside}"


# A variant's tensor names are spelled where its spec declares them and where its attention math uses them; every
# other module derives them from the spec. The two float64 references that check import_fleet and the MoE transforms
# keep their own spellings on purpose: derived from the specs, they would depend on what they check.
INDEPENDENT_REFERENCES = {"transform/fleet_reference.py", "moe/reference.py"}
SPELLED_ONLY_IN = {
    "shared_kv_proj": {"vha/spec.py", "vha/attention.py", "shared_kv/spec.py", "shared_kv/attention.py",
                       *INDEPENDENT_REFERENCES},
    "vha_postmix_U": {"vha/spec.py", "vha/attention.py", *INDEPENDENT_REFERENCES},
    "hlc": {"mea/spec.py", "mea/functional.py", "mea/attention.py"},  # MEA's head linear combination
}


def test_variant_tensor_names_are_spelled_in_their_spec_and_math_only():
    import re

    found = {name: set() for name in SPELLED_ONLY_IN}
    for path in _modules().values():
        text = open(path, encoding="utf-8").read()
        for name in SPELLED_ONLY_IN:
            if re.search(rf"\b{name}\b", text):
                found[name].add(os.path.relpath(path, PKG).replace(os.sep, "/"))
    for name, files in found.items():
        print(f"{name}: {len(files)} package files: {sorted(files)}")
    assert all(found.values())  # the scan sees the names where they are declared
    extra = {name: sorted(files - SPELLED_ONLY_IN[name]) for name, files in found.items() if files - SPELLED_ONLY_IN[name]}
    assert not extra, f"tensor names spelled outside their variant's spec and attention math: {extra}"


def test_registry_entries_agree_with_their_classes():
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.families import FAMILIES, family, family_of, UnknownFamily

    for model_type, fam in FAMILIES.items():
        assert fam.config_class.model_type == model_type, model_type
        assert family_of(fam.config_class) is fam
        if not fam.has_model:  # a checkpoint-level family (Qwen3-MoE): asking for its model is one line
            with pytest.raises(CheckpointError, match="no Paddle model"):
                fam.model_class
            continue
        assert fam.model_class.config_class.model_type == model_type, model_type
    with pytest.raises(UnknownFamily, match="model_type 'gemma3' is not one of qwen3, qwen3_vha, qwen3_mea, qwen3_shared_kv"):
        family("gemma3")


def _stems(folder):
    return {os.path.splitext(f)[0] for f in os.listdir(folder) if f.endswith(".py")} - {"__init__"}


def _imported_modules(tree):
    return [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level] + \
        [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]


def test_tools_are_thin_and_installed():
    """tools/*.py never edit sys.path; a product command line there is a call into paddle_vha.cli, and every
    paddle_vha.cli module is a console script (and back); an experiment there is a call into tools/experiments/, which
    is neither in the package, nor imported by it, nor installed."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    import importlib

    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name
    commands = _stems(os.path.join(PKG, "cli"))
    assert {t.split(":")[0].rsplit(".", 1)[1] for t in scripts.values()} == commands
    experiments = _stems(EXPERIMENTS)
    assert EXPERIMENT_TOOLS <= experiments and not commands & experiments, (commands, experiments)
    for f in sorted(os.listdir(os.path.join(ROOT, "tools"))):
        if f.endswith(".py"):
            tree = ast.parse(open(os.path.join(ROOT, "tools", f), encoding="utf-8").read())
            edits = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"
                     and isinstance(n.value, ast.Name) and n.value.id == "sys"]
            assert not edits, f"tools/{f}:{edits[0]} touches sys.path"
            stem = f[:-3]
            if stem in commands:  # a thin command line: the package does the work
                assert len(tree.body) <= 4, f"tools/{f} is more than a call into paddle_vha.cli.{stem}"
                assert f"paddle_vha.cli.{stem}" in _imported_modules(tree), f"tools/{f} does not call paddle_vha.cli"
            elif stem in EXPERIMENT_TOOLS:  # a thin runner: tools/experiments/ does the work
                assert len(tree.body) <= 4, f"tools/{f} is more than a call into tools/experiments/{stem}.py"
                assert f"experiments.{stem}" in _imported_modules(tree), f"tools/{f} does not call experiments.{stem}"
    for m, path in _modules().items():  # the package never reaches into the checkout's experiments
        roots = {name.split(".")[0] for name in _imported_modules(ast.parse(open(path, encoding="utf-8").read()))}
        assert not roots & {"experiments", "tools"}, f"{m} imports experiment code"


@pytest.mark.slow
def test_wheel_installs_commands_and_builds_the_op(tmp_path):
    """`pip wheel .` -> a fresh virtual environment -> paddle-vha-fold --help and paddle-vha-build-ops work there.

    The fresh environment sees the pinned dependencies of this one through a .pth file (no second download of Paddle),
    and installs the wheel alone: what is tested is the wheel's content (package, op sources, entry points)."""
    import site
    import sysconfig

    wheels = tmp_path / "wheels"
    run = lambda *cmd, **kw: subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)  # noqa: E731
    r = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), ROOT,
            "--disable-pip-version-check", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = list(wheels.glob("paddle_vha-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "paddle_vha/_ops/build.py" in names and "paddle_vha/_ops/csrc/register_op.cc" in names
    assert not any(n.startswith(("tests/", "tools/", "ops/", "experiments/", "assets/")) for n in names)
    assert not any(n.startswith("paddle_vha/") and n.endswith(tuple(f"/{e}.py" for e in EXPERIMENT_TOOLS)) for n in names)

    venv = tmp_path / "venv"
    r = run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    purelib = run(str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    with open(os.path.join(purelib, "pinned_deps.pth"), "w") as f:  # the pinned dependencies of this environment
        f.write("\n".join(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]) + "\n")
    r = run(sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", str(wheel), "-q",
            "--disable-pip-version-check")
    if r.returncode and "no such option: --python" in r.stderr:  # pip < 22.3: install with the target's own pip
        r = run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--prefix", str(venv), str(wheel), "-q",
                "--disable-pip-version-check")
    assert r.returncode == 0, r.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    where = run(str(py), "-c", "import paddle_vha, os; print(os.path.dirname(paddle_vha.__file__))", env=env,
                cwd=str(tmp_path)).stdout.strip()
    assert where.startswith(str(venv)), f"the fresh environment imported paddle_vha from {where}"
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = set(tomllib.load(f)["project"]["scripts"])
    installed = {p.name for p in (venv / "bin").glob("paddle-vha-*")}
    assert installed == scripts, installed ^ scripts  # the product commands, and no experiment
    assert not installed & {"paddle-vha-" + e.replace("_", "-") for e in EXPERIMENT_TOOLS}
    r = run(str(venv / "bin" / "paddle-vha-fold"), "--help", env=env, cwd=str(tmp_path))
    assert r.returncode == 0 and "usage: paddle-vha-fold" in r.stdout and "--dry-run" in r.stdout, r.stderr[-2000:]
    # The wheel carries the op's sources byte for byte: the same digest as the checkout's ops/, which tools/env.sh
    # compiled with the build's own flags before this suite ran. Here the wheel's command builds them at -O0
    # (VHA_OPS_CFLAGS is appended last): what is checked is that it builds the wheel's copy and that copy loads;
    # -O0 takes 38 s against 87 s at -O3 on 2 cores.
    build = tmp_path / "op-build"
    op_env = dict(env, VHA_OPS_BUILD_DIR=str(build), VHA_OPS_CFLAGS="-O0")  # the load below reuses that build
    r = run(str(venv / "bin" / "paddle-vha-build-ops"), env=op_env, cwd=str(tmp_path))
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0 and "vha_prologue built" in r.stdout, r.stderr[-2000:]
    code = ("from paddle_vha.kernels.op_loader import build_script, load_op, ops_source_dir; import sys; "
            "print(ops_source_dir()); print(build_script().sources_digest()); sys.exit(load_op() is None)")
    r = run(str(py), "-c", code, env=op_env, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip().startswith(str(venv)), r.stdout + r.stderr[-2000:]
    from paddle_vha.kernels.op_loader import build_script

    ours, theirs = build_script().sources_digest(), r.stdout.split()[1]  # the checkout's ops/, the wheel's copy
    assert len(ours) == 64 and theirs == ours, (ours, theirs)
