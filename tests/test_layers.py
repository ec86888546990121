"""The layer rules of ``docs/architecture.md`` ("Layers"), checked on every import in ``src/``.

Each module's imports are read from its syntax tree (module level and inside functions alike), so
a rule also holds for imports deferred into a function body.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "clawrl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _imports() -> dict[str, set[str]]:
    """module -> the ``clawrl`` modules it imports (``from a import b`` counts as ``a`` and
    ``a.b``: ``b`` may be a module)."""
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    if path.name != "__init__.py":
                        base = base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join([*base, node.module] if node.module else base)
                else:
                    module = node.module or ""
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
        out[name] = {m for m in found if m == "clawrl" or m.startswith("clawrl.")}
    return out


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(importers: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()):
    return sorted(
        (mod, imp)
        for mod, imps in _imports().items()
        if _within(mod, importers)
        for imp in imps
        if any(_within(imp, f) for f in forbidden) and not any(_within(imp, a) for a in allowed)
    )


def _outside(package: str, exempt: tuple[str, ...] = ()):
    return [
        m for m in _imports() if not _within(m, package) and not any(_within(m, e) for e in exempt)
    ]


def test_the_import_graph_is_read():
    """The rules below would pass on an empty graph: make sure it is not empty."""
    graph = _imports()
    assert len(graph) > 150
    assert "clawrl.runtime" in graph["clawrl.cli.serve"] or any(
        _within(i, "clawrl.runtime") for i in graph["clawrl.cli.serve"]
    )
    assert "clawrl.algorithms.config" in graph["clawrl.config.method"]


def test_config_imports_only_configs():
    """Settings are importable without torch and know nothing of the parts they configure."""
    bad = _violations("clawrl.config", ("clawrl",), ("clawrl.config", "clawrl.errors"))
    bad = [(m, i) for m, i in bad if not _within(i, "clawrl.algorithms.config")]
    assert bad == []


def test_nothing_below_the_command_line_imports_it():
    bad = []
    for mod in _outside("clawrl.cli", exempt=("clawrl.__main__",)):
        bad += [(mod, i) for i in _imports()[mod] if _within(i, "clawrl.cli")]
    assert bad == []


def test_only_applications_build_the_runtime():
    """``clawrl.runtime`` is the composition root: the command line and the demo (an application
    of its own) call it; nothing it builds imports it back."""
    bad = []
    for mod in _outside("clawrl.cli", exempt=("clawrl.demo", "clawrl.runtime", "clawrl.__main__")):
        bad += [(mod, i) for i in _imports()[mod] if _within(i, "clawrl.runtime")]
    assert bad == []


def test_production_code_never_imports_test_tools():
    bad = []
    for mod in _outside("clawrl.testing"):
        bad += [(mod, i) for i in _imports()[mod] if _within(i, "clawrl.testing")]
    assert bad == []


@pytest.mark.parametrize(
    ("package", "forbidden", "allowed"),
    [
        ("clawrl.algorithms", ("clawrl",), ("clawrl.algorithms", "clawrl.errors")),
        ("clawrl.chat", ("clawrl.engine", "clawrl.gateway", "clawrl.store", "clawrl.trainer"), ()),
        ("clawrl.store", ("clawrl",), ("clawrl.store", "clawrl.errors", "clawrl.lru")),
        ("clawrl.trajectory", ("clawrl",), ("clawrl.trajectory", "clawrl.store", "clawrl.errors")),
        ("clawrl.engine", ("clawrl.gateway", "clawrl.store", "clawrl.trainer", "clawrl.judge"), ()),
        ("clawrl.judge", ("clawrl.trainer", "clawrl.gateway", "clawrl.harness", "clawrl.demo"), ()),
        (
            "clawrl.dashboard",
            ("clawrl.demo", "clawrl.engine", "clawrl.trainer", "clawrl.gateway"),
            (),
        ),
        ("clawrl.gateway", ("clawrl.trainer", "clawrl.judge", "clawrl.harness", "clawrl.demo"), ()),
        (
            "clawrl.memory",
            ("clawrl",),
            (
                "clawrl.memory",
                "clawrl.chat",
                "clawrl.store",
                "clawrl.judge.hints",
                "clawrl.judge.types",
                "clawrl.errors",
            ),
        ),
        (
            "clawrl.trainer",
            ("clawrl.gateway", "clawrl.harness", "clawrl.demo", "clawrl.dashboard"),
            (),
        ),
    ],
)
def test_package_layers(package, forbidden, allowed):
    assert _violations(package, forbidden, allowed) == []


def _classes_and_modules():
    classes: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(_module_name(path))
    return classes


def test_one_definition_of_the_next_state_and_one_statistics_module():
    classes = _classes_and_modules()
    assert classes["NextState"] == ["clawrl.trajectory.next_state"]
    assert classes["NextStateRole"] == ["clawrl.trajectory.next_state"]
    assert sorted(_module_name(p) for p in PACKAGE.rglob("stats.py")) == ["clawrl.stats"]


def test_the_judge_worker_lives_with_the_judge():
    assert (PACKAGE / "judge" / "worker.py").exists()
    assert not list((PACKAGE / "trainer").glob("*judge*"))


def test_no_engine_fact_is_read_with_getattr():
    """Every fact anyone reads of an engine is declared by ``clawrl.engine.Engine``."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and "engine" in ast.unparse(node.args[0]).lower()
            ):
                bad.append(f"{_module_name(path)}:{node.lineno} {ast.unparse(node)}")
    assert bad == []


def test_docstrings_cite_only_files_in_the_repository():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for needle in ("STYLE.md", "DESIGN.md", "ENGINES.md", "HARNESSES.md", "../shared"):
            if needle in text:
                bad.append(f"{path.relative_to(SRC)}: {needle}")
    assert bad == []
