"""The packages' import arrows point down (docs/layout.md): no cycles; the trace side never reaches
into ``iris``; the runtime imports only down its layers; and that page names every module."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "iris_trace"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function, as absolute names."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            if node.module:
                found.add(name)
            # ``from . import wire`` imports a module, not a name.
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's own __init__ aside: importing
    a submodule always runs it first)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in _imports(path) if m in modules and m != name and not name.startswith(m + ".")}
        for name, path in modules.items()
    }


def test_the_trace_package_never_imports_the_runtime():
    for path in PACKAGE.rglob("*.py"):
        runtime = {m for m in _imports(path) if m == "iris" or m.startswith("iris.")}
        assert not runtime, f"{path.name} imports {runtime}"


def test_only_the_command_line_and_the_package_face_import_the_exporters():
    graph = _graph()
    for name, targets in graph.items():
        if name.startswith("iris_trace.export") or name in ("iris_trace.cli",):
            continue
        exporters = {t for t in targets if t.startswith("iris_trace.export")}
        assert not exporters, f"{name} imports {exporters}"


def _assert_no_cycles(edges: dict[str, set[str]]) -> None:
    """Fail naming the first import cycle found in ``edges`` (module -> modules it imports)."""
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(name) :] + [name]))
        state[name] = 1
        for target in sorted(edges[name]):
            visit(target, path + [name])
        state[name] = 2

    for name in sorted(edges):
        visit(name, [])


def test_the_trace_modules_import_each_other_without_cycles():
    _assert_no_cycles(_graph())


def test_the_layout_page_names_every_module():
    root = PACKAGE.parent
    page = (root / "docs" / "layout.md").read_text()
    unnamed = [
        str(path.relative_to(root))
        for package in ("iris", "iris_trace")
        for path in (root / package).rglob("*.py")
        if not re.search(rf"(?<![\w.]){re.escape(path.name)}\b|(?<![\w.]){re.escape(path.stem)}/", page)
        and path.name != "__init__.py"
    ]
    assert not unnamed, f"docs/layout.md does not name {unnamed}"


# ---------------------------------------------------------------- the runtime's layers
RUNTIME = PACKAGE.parent / "iris"
#: The runtime's layers, lowest first: a module imports (at its top) only modules of its own
#: layer or below. Modules named nowhere are the top (the host API object, the launcher, ...).
LAYERS = [
    ("iris._env", "iris._pci", "iris.errors"),
    ("iris.backends",),
    ("iris.config", "iris.host.log"),
    ("iris.device",),
    ("iris.host.prepared", "iris.host.distributed.helpers", "iris.host.group_slots", "iris.host.memory",
     "iris.host.flight", "iris.host.signal_notes"),
    ("iris.ccl", "iris.ops", "iris.host.copy_engine", "iris.host.tracing", "iris.host.hang",
     "iris.host.distributed.topology"),
]  # fmt: skip


def _runtime_graph() -> dict[str, set[str]]:
    """Runtime module -> the runtime modules it imports at its top (imports inside functions,
    made on first use, are left out: they are how a lower layer calls up without a cycle)."""
    modules = {}
    for path in RUNTIME.rglob("*.py"):
        parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name and not name.startswith(m + ".")}
    # A package whose __init__ imports nothing is a folder: importing through it is no arrow.
    folders = {name for name, targets in graph.items() if modules[name].name == "__init__.py" and not targets}
    return {name: targets - folders for name, targets in graph.items() if name not in folders}


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return len(LAYERS)


def test_the_runtime_imports_only_down_its_layers():
    upward = [
        f"{name} -> {target}"
        for name, targets in _runtime_graph().items()
        for target in targets
        if _layer(target) > _layer(name)
    ]
    assert not upward, upward


def test_the_runtime_modules_import_each_other_without_cycles():
    _assert_no_cycles(_runtime_graph())
