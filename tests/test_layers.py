"""The layer rule of seqdiff, checked on the source: every import of a seqdiff module by a seqdiff module,
those inside functions and under `if TYPE_CHECKING:` included, read with `ast` (nothing is imported).

- The layers are read from the table in the docstring of seqdiff/__init__.py (the one statement of them):
  each line names folders (`data/`) and files (`checkpoint.py`); a file named on a line overrides the
  folder it sits in. Every module must fall under exactly one entry, and every entry must exist.
- An edge is an import statement (`import seqdiff.a.b`, `from seqdiff.a import b` where b is a submodule,
  relative imports resolved) or a string that names a seqdiff module exactly (`"seqdiff.a.b"` or
  `"seqdiff.a.b:Name"`, the form registries use to import late by name).
- Fails on (a) an import cycle between modules, (b) a cycle between the table's entries (folders / files),
  (c) an import from a lower layer to a higher one, (d) any import of `pipelines` or `experiments`.
- Importing seqdiff.a.b also runs seqdiff/a/__init__.py; that implied edge is not counted (it stays inside
  the folder's own layer, and counting it would flag every package that re-exports its submodules).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "seqdiff"
FORBIDDEN = ("pipelines", "experiments")
MODULE_STRING = re.compile(r"seqdiff(\.\w+)+(:\w+)?")

# Known exceptions: (importer, imported) module pairs, each with the reason it is allowed for now. The test
# also fails on an entry that no longer matches an edge, so the list cannot outlive its reasons.
ALLOWED: dict[tuple[str, str], str] = {
    # config.py fills `{registry:NAME}` in field docstrings with the registries' current keys, naming them by
    # module path (REGISTRY_KEYS) and importing them only when help text is built, so that a help text cannot
    # go stale; the configs stay below the code they configure at import time
    ("seqdiff.config", "seqdiff.backbones"): "help text names the registries",
    ("seqdiff.config", "seqdiff.methods"): "help text names the registries",
    ("seqdiff.config", "seqdiff.schedules"): "help text names the registries",
    ("seqdiff.config", "seqdiff.data"): "help text names the registries",
    ("seqdiff.config", "seqdiff.tokenizers"): "help text names the registries",
    ("seqdiff.config", "seqdiff.samplers"): "help text names the registries",
}


# ---------------------------------------------------------------------------------------------- the layer table
def layer_table() -> list[list[str]]:
    """The entries of each layer, bottom first, from the docstring of seqdiff/__init__.py."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")))
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Layers, from the bottom up"))
    layers = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        names = re.split(r"\s{2,}", line.strip())[0]
        layers.append([n.strip() for n in names.split(",")])
    return layers


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def entry_of(path: Path, entries: list[str]) -> str | None:
    """The most specific table entry covering `path` (a file entry beats its folder's)."""
    rel = path.relative_to(PACKAGE).as_posix()
    if rel in entries:
        return rel
    folders = [e for e in entries if e.endswith("/") and rel.startswith(e)]
    return max(folders, key=len) if folders else None


# ---------------------------------------------------------------------------------------------- the edges
def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every seqdiff / pipelines / experiments module that `module` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        """The longest prefix of a dotted name that is a seqdiff module (a name inside one is not a module)."""
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in modules:
                return ".".join(parts[:n])
        return None

    def add(name: str) -> None:
        root = name.split(".")[0]
        if root in FORBIDDEN:
            found.add(name)
        elif root == "seqdiff" and (target := resolve(name)) is not None and target != module:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:  # `from seqdiff.a import b`: b may be a submodule
                add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            add(node.value.split(":")[0])
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; the components with more than one node (no module imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def checked_edges() -> list[tuple[str, str]]:
    """Every (importer, imported) edge, the ALLOWED ones left out."""
    return [(a, b) for a, targets in import_graph().items() for b in sorted(targets) if (a, b) not in ALLOWED]


def _cycle_report(components: list[list[str]], edges: list[tuple[str, str]]) -> str:
    lines = []
    for component in components:
        inside = set(component)
        lines.append("  {" + ", ".join(component) + "}: " +
                     "; ".join(f"{a} -> {b}" for a, b in edges if a in inside and b in inside))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the checks
def test_the_layer_table_matches_the_tree():
    entries = [e for layer in layer_table() for e in layer]
    assert len(entries) == len(set(entries)), f"an entry is named twice in the layer table: {entries}"
    missing = [e for e in entries if not (PACKAGE / e).exists()]
    assert not missing, f"the layer table of seqdiff/__init__.py names {missing}, which do not exist"
    unplaced = [p.relative_to(PACKAGE).as_posix() for p in module_files().values() if entry_of(p, entries) is None]
    assert not unplaced, (f"{unplaced} sit in no layer: add the file or its folder to the layer table in "
                          f"seqdiff/__init__.py")


def test_no_import_cycle_between_modules():
    graph = defaultdict(set)
    for a, b in checked_edges():
        graph[a].add(b)
    components = strongly_connected(graph)
    assert not components, "import cycles between modules:\n" + _cycle_report(components, checked_edges())


def test_no_import_cycle_between_folders():
    entries = [e for layer in layer_table() for e in layer]
    files = module_files()
    unit = {m: entry_of(p, entries) for m, p in files.items()}
    graph: dict[str, set[str]] = defaultdict(set)
    witnesses = []
    for a, b in checked_edges():
        if unit.get(a) is not None and unit.get(b) is not None and unit[a] != unit[b]:  # unplaced: see above
            graph[unit[a]].add(unit[b])
            witnesses.append((unit[a], unit[b], f"{a} -> {b}"))
    components = strongly_connected(graph)
    report = "\n".join("  {" + ", ".join(c) + "}: " + "; ".join(w for x, y, w in witnesses if x in c and y in c)
                       for c in components)
    assert not components, "import cycles between entries of the layer table:\n" + report


def test_no_import_runs_up_the_layers():
    layers = layer_table()
    entries = [e for layer in layers for e in layer]
    rank = {e: i for i, layer in enumerate(layers) for e in layer}
    files = module_files()
    level = {m: rank[e] for m, p in files.items() if (e := entry_of(p, entries)) is not None}
    upward = [f"  {a} (layer {level[a]}: {entry_of(files[a], entries)}) -> {b} "
              f"(layer {level[b]}: {entry_of(files[b], entries)})"
              for a, b in checked_edges() if a in level and b in level and level[b] > level[a]]
    assert not upward, ("imports that run up the layers of seqdiff/__init__.py (bottom = layer 0):\n"
                        + "\n".join(upward))


def test_nothing_in_seqdiff_imports_pipelines_or_experiments():
    bad = [f"  {a} -> {b}" for a, b in checked_edges() if b.split(".")[0] in FORBIDDEN]
    assert not bad, "seqdiff must not import pipelines/ or experiments/:\n" + "\n".join(bad)


IMPORT_LINE = re.compile(r"^\s*(?:from|import)\s+(?:pipelines|experiments)\b"
                         r"|import_module\(\s*[\"'](?:pipelines|experiments)\b", re.MULTILINE)


def test_no_file_in_seqdiff_names_experiments_in_an_import():
    """A plain-text check beside the graph one: no import line, and no importlib.import_module of a name,
    reaches `experiments` (the studies, not installed) or `pipelines` (their old home) from seqdiff/."""
    bad = [f"  {path.relative_to(PACKAGE.parent)}: {m.group(0).strip()}"
           for path in sorted(PACKAGE.rglob("*.py")) for m in IMPORT_LINE.finditer(path.read_text(encoding="utf-8"))]
    assert not bad, "seqdiff must not import experiments/ or pipelines/:\n" + "\n".join(bad)


def test_every_allowed_exception_is_still_needed():
    edges = {(a, b) for a, targets in import_graph().items() for b in targets}
    stale = sorted(set(ALLOWED) - edges)
    assert not stale, f"ALLOWED lists edges that no longer exist; remove them: {stale}"


# ---------------------------------------------------------------------------------------------- the checker itself
@pytest.fixture
def tiny_package(tmp_path, monkeypatch):
    """A fake seqdiff package in tmp_path, for checking that the checks can fail."""
    root = tmp_path / "seqdiff"

    def write(files: dict[str, str]) -> None:
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")

    monkeypatch.setitem(globals(), "PACKAGE", root)
    monkeypatch.setitem(globals(), "ALLOWED", {})
    return write


TABLE = ('"""x\n\nLayers, from the bottom up (...):\n'
         '  __init__.py, errors.py   leaf\n  low/        low\n  high/, top.py  high\n"""\n')


def test_the_checks_fail_on_a_cycle_an_upward_import_and_a_relative_one(tiny_package):
    tiny_package({
        "__init__.py": TABLE,
        "errors.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from seqdiff.low import b  # a submodule, inside a function\n",
        "low/b.py": "from . import a\nfrom ..high.c import g\n",
        "high/__init__.py": "",
        "high/c.py": "from seqdiff.errors import SeqdiffError\nNAME = 'seqdiff.top:main'\n",
        "top.py": "import experiments.quickstart_sweep\n",
    })
    graph = import_graph()
    assert graph["seqdiff.low.a"] == {"seqdiff.low.b"}
    assert graph["seqdiff.low.b"] == {"seqdiff.low.a", "seqdiff.high.c"}
    assert graph["seqdiff.high.c"] == {"seqdiff.errors", "seqdiff.top"}
    assert graph["seqdiff.top"] == {"experiments.quickstart_sweep"}
    test_the_layer_table_matches_the_tree()
    with pytest.raises(AssertionError, match=r"\{seqdiff.low.a, seqdiff.low.b\}"):
        test_no_import_cycle_between_modules()
    with pytest.raises(AssertionError, match=r"seqdiff.low.b \(layer 1: low/\) -> seqdiff.high.c \(layer 2"):
        test_no_import_runs_up_the_layers()
    with pytest.raises(AssertionError, match="seqdiff.top -> experiments.quickstart_sweep"):
        test_nothing_in_seqdiff_imports_pipelines_or_experiments()
    with pytest.raises(AssertionError, match="top.py: import experiments"):
        test_no_file_in_seqdiff_names_experiments_in_an_import()


def test_the_checks_fail_on_a_folder_cycle_and_an_unplaced_module(tiny_package):
    tiny_package({
        "__init__.py": TABLE,
        "errors.py": "",
        "low/__init__.py": "",
        "high/__init__.py": "",
        "high/c.py": "import seqdiff.high.d\nfrom seqdiff import top\n",
        "high/d.py": "",
        "top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from seqdiff.high import d\n",
        "stray.py": "",
    })
    with pytest.raises(AssertionError, match="stray.py"):
        test_the_layer_table_matches_the_tree()
    test_no_import_cycle_between_modules()  # c -> top -> d: no cycle between modules ...
    with pytest.raises(AssertionError, match=r"\{high/, top.py\}"):  # ... but one between the entries
        test_no_import_cycle_between_folders()


def test_a_file_entry_overrides_its_folder_and_a_stale_exception_fails(tiny_package):
    tiny_package({
        "__init__.py": TABLE.replace("high/, top.py  high", "high/, top.py, low/cmd.py  high"),
        "errors.py": "",
        "low/__init__.py": "",
        "low/a.py": "",
        "low/cmd.py": "from seqdiff.high import c\n",  # at the top with the high layer: allowed
        "high/__init__.py": "",
        "high/c.py": "from seqdiff.low import a\n",
        "top.py": "",
    })
    test_the_layer_table_matches_the_tree()
    test_no_import_runs_up_the_layers()
    test_no_import_cycle_between_folders()  # low/cmd.py is its own entry, so low/ -> high/ -> low/ is no cycle
    globals()["ALLOWED"][("seqdiff.low.a", "seqdiff.high.c")] = "a reason that no longer holds"
    with pytest.raises(AssertionError, match="no longer exist"):
        test_every_allowed_exception_is_still_needed()
