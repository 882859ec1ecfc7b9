"""The package map of tuner and the facts a newcomer meets first, computed from the source.

``LAYERS`` is the map: a package (or top-level module) imports only from packages in lower layers,
never from a sibling in its own layer. The README's layout section lists the same map and
``test_layers.py`` keeps both true.

Run ``python -m tests.arch_tests.structure [TUNER_PACKAGE_DIR] [--json] [--functions PACKAGE]`` for
the figures: packages with their size and largest function, the largest functions overall (or of
one package), imports inside functions (and which of them break the rule), bare trial-status
literals outside ``tuner/lifecycle.py``, and imports against the map.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "tuner"

# top to bottom; a name is a subpackage or a top-level module of tuner
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),
    ("cli",),
    ("compare",),
    ("bench", "report"),
    ("study",),
    ("evaluation", "profile"),
    ("backends", "sim"),
    ("planner", "kernels", "tinymodels", "explain"),
    ("config", "storage"),
    ("catalog", "workload"),
    ("limits", "paths", "safewrite", "safeyaml"),
    ("errors",),
    ("lifecycle",),
    ("vocabulary",),
    ("__init__",),  # the version string only
]

# Imports inside functions are kept only for these: heavy libraries (seconds of start-up, or GPU
# stacks that a CPU machine may lack) and the command modules the CLI loads on demand.
HEAVY_LIBRARIES = frozenset({
    "optuna", "ray", "torch", "triton", "transformers", "tokenizers", "sglang", "aiohttp", "pandas",
    "sqlalchemy", "scipy", "pynvml", "playwright", "uvloop", "psycopg", "sgl_kernel", "flashinfer",
})
# Command modules import what a command runs inside the command (`tuner --help` loads no more).
COMMAND_LOADING = ("cli",)
# Packages whose owners keep their own import style (GPU kernels: torch/triton at import time
# would break CPU machines, so that package loads lazily throughout).
EXEMPT_FROM_LOCAL_IMPORT_RULE = ("kernels",)

# Modules that still import inside functions against the rule, with how many such imports they may
# keep (the test lets the numbers only shrink): the study loader and the schema.
LOCAL_IMPORTS_TO_MOVE: dict[str, int] = {}

# The trial-status vocabulary, as it was spelt before the enum existed (for counting literals in
# any tree, old or new). The enum in tuner/lifecycle.py is the source of truth.
STATUS_WORDS = frozenset({"running", "complete", "pruned", "infeasible", "failed", "interrupted",
                          "finished", "stopped"})
# (module, word): the word in a meaning other than a trial/study status.
STATUS_WORD_OTHER_MEANINGS = {
    ("kernels/benchmark.py", "complete"): "a kernel benchmark row that measured every tile",
    ("kernels/summarize.py", "complete"): "the same benchmark rows, read back",
    ("kernels/compile.py", "failed"): "a kernel compile error message",
    ("study/samplers.py", "infeasible"): "Optuna's constraint name, stored in existing databases",
    ("cli/kernels.py", "complete"): "a tile-tuning report that covered every batch size",
    ("kernels/tune.py", "complete"): "the same tile-tuning state, per batch size",
    ("kernels/sglang_tune.py", "complete"): "the same tile-tuning state, per batch size",
    ("kernels/worth.py", "complete"): "the same tile-tuning report, read back",
    ("kernels/sglang_compile.py", "failed"): "a kernel compile error message",
}


# earlier names of packages, so that an older tree can be measured against the same map
FORMER_NAMES = {"spec": "config", "models": "tinymodels"}


def layer_number(name: str) -> str:
    """The number the README shows (0 at the bottom); the entry and version modules have none."""
    i = layer_of(name)
    if i is None or LAYERS[i] in (("__main__",), ("__init__",)):
        return "-" if i is not None else "?"
    return str(len(LAYERS) - 2 - i)


def layer_of(name: str) -> int | None:
    name = FORMER_NAMES.get(name, name)
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    return None


@dataclass
class Module:
    path: Path
    rel: str  # relative to the package dir, e.g. "study/runner.py"
    unit: str  # subpackage or top-level module name
    tree: ast.Module
    lines: int


def modules(package_dir: Path = PACKAGE_DIR) -> list[Module]:
    out = []
    for f in sorted(package_dir.rglob("*.py")):
        rel = f.relative_to(package_dir).as_posix()
        parts = rel.split("/")
        unit = parts[0] if len(parts) > 1 else parts[0][:-3]
        text = f.read_text()
        out.append(Module(f, rel, unit, ast.parse(text), text.count("\n")))
    return out


def module_name(mod: Module) -> str:
    return "tuner." + mod.rel[:-3].replace("/", ".").removesuffix(".__init__")


def _imported(node: ast.AST, mod: Module, known: set[str]) -> list[str]:
    """Absolute dotted names of the modules an import statement loads (``from package import
    submodule`` names the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against the module's package
            base = ["tuner", *mod.rel[:-3].split("/")][:-node.level]
            package = ".".join(base + ([node.module] if node.module else []))
        else:
            package = node.module or ""
        subs = [f"{package}.{a.name}" for a in node.names if f"{package}.{a.name}" in known]
        return subs if len(subs) == len(node.names) else [package, *subs]
    return []


@dataclass
class Import:
    module: str  # the importing module (relative path)
    unit: str
    target: str  # dotted name
    lineno: int
    in_function: bool

    @property
    def target_unit(self) -> str | None:
        parts = self.target.split(".")
        if parts[0] != "tuner":
            return None
        return parts[1] if len(parts) > 1 else "__init__"


def imports(mods: list[Module]) -> list[Import]:
    known = {module_name(m) for m in mods}
    out = []
    for m in mods:
        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _imported(child, m, known):
                        out.append(Import(m.rel, m.unit, target, child.lineno, in_function))
                visit(child, fn)
        visit(m.tree, False)
    return out


def heavy_modules(mods: list[Module], imps: list[Import]) -> set[str]:
    """tuner modules whose import (at their top level, transitively) loads a heavy library."""
    name = {m.rel: module_name(m) for m in mods}
    top: dict[str, set[str]] = {n: set() for n in name.values()}
    heavy = set()
    for i in imps:
        if i.in_function:
            continue
        if i.target.split(".")[0] in HEAVY_LIBRARIES:
            heavy.add(name[i.module])
        elif i.target_unit is not None:
            top[name[i.module]].add(i.target)
    changed = True
    while changed:
        changed = False
        for mod, targets in top.items():
            if mod not in heavy and any(t in heavy for t in targets):
                heavy.add(mod)
                changed = True
    return heavy


def local_import_breaks_rule(imp: Import, heavy: set[str] = frozenset()) -> bool:
    """An import inside a function that loads no heavy library (directly, or through the tuner
    module it imports) and is not command loading."""
    if not imp.in_function or imp.unit in EXEMPT_FROM_LOCAL_IMPORT_RULE or imp.unit in COMMAND_LOADING:
        return False
    if imp.target_unit is not None:
        return imp.target not in heavy
    return imp.target.split(".")[0] not in HEAVY_LIBRARIES


def layer_violations(imps: list[Import]) -> list[str]:
    out = []
    for imp in imps:
        tu = imp.target_unit
        if tu is None or tu == imp.unit:
            continue
        src, dst = layer_of(imp.unit), layer_of(tu)
        if src is None or dst is None:
            out.append(f"{imp.module}:{imp.lineno}: {imp.unit} or {tu} is not on the map")
        elif dst <= src:
            how = "a sibling in its layer" if dst == src else "a higher layer"
            out.append(f"{imp.module}:{imp.lineno}: {imp.unit} imports {imp.target} ({how})")
    return out


@dataclass
class Function:
    name: str
    module: str
    lineno: int
    lines: int


def functions(mods: list[Module]) -> list[Function]:
    out = []
    for m in mods:
        def visit(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = prefix + child.name
                    out.append(Function(name, m.rel, child.lineno, child.end_lineno - child.lineno + 1))
                    visit(child, name + ".")
                elif isinstance(child, ast.ClassDef):
                    visit(child, prefix + child.name + ".")
        visit(m.tree, "")
    return sorted(out, key=lambda f: -f.lines)


@dataclass
class Literal:
    module: str
    lineno: int
    word: str


def status_literals(mods: list[Module], *, enum_module: str = "lifecycle.py") -> list[Literal]:
    """String constants spelling a trial or study status outside the enum module (docstrings and
    the listed other meanings aside)."""
    out = []
    for m in mods:
        if m.rel == enum_module:
            continue
        docstrings = set()
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                body = getattr(node, "body", [])
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    docstrings.add(id(body[0].value))
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STATUS_WORDS
                    and id(node) not in docstrings and (m.rel, node.value) not in STATUS_WORD_OTHER_MEANINGS):
                out.append(Literal(m.rel, node.lineno, node.value))
    return out


@dataclass
class Report:
    packages: dict[str, dict] = field(default_factory=dict)
    largest_functions: list[dict] = field(default_factory=list)
    largest_function_by_package: dict[str, dict] = field(default_factory=dict)
    imports_in_functions: dict = field(default_factory=dict)
    status_literals_outside_enum: int = 0
    status_literals_by_module: dict[str, int] = field(default_factory=dict)
    layer_violations: list[str] = field(default_factory=list)


def report(package_dir: Path = PACKAGE_DIR, top: int = 5, package: str | None = None) -> Report:
    mods = modules(package_dir)
    r = Report()
    for m in mods:
        p = r.packages.setdefault(m.unit, {"modules": 0, "lines": 0})
        p["modules"] += 1
        p["lines"] += m.lines
    fns = functions(mods)
    chosen = [f for f in fns if package is None or f.module.startswith(package + "/")]
    r.largest_functions = [{"function": f.name, "module": f.module, "line": f.lineno, "lines": f.lines}
                           for f in chosen[:top]]
    for f in fns:  # sorted largest first
        unit = f.module.split("/")[0] if "/" in f.module else f.module[:-3]
        r.largest_function_by_package.setdefault(unit, {"function": f.name, "module": f.module, "lines": f.lines})
    imps = imports(mods)
    local = [i for i in imps if i.in_function]
    r.imports_in_functions = {
        "total": len(local),
        "tuner_internal": sum(1 for i in local if i.target_unit is not None),
        "tuner_internal_outside_cli": sum(1 for i in local if i.target_unit is not None
                                          and i.unit not in COMMAND_LOADING),
        "breaking_the_rule": sum(1 for i in local if local_import_breaks_rule(i, heavy_modules(mods, imps))),
    }
    lits = status_literals(mods)
    r.status_literals_outside_enum = len(lits)
    for lit in lits:
        r.status_literals_by_module[lit.module] = r.status_literals_by_module.get(lit.module, 0) + 1
    r.layer_violations = layer_violations(imps)
    return r


def _print(r: Report) -> None:
    print(f"packages ({len(r.packages)}):")
    for name, p in sorted(r.packages.items(), key=lambda kv: (layer_of(kv[0]) is None, layer_of(kv[0]) or 0)):
        big = r.largest_function_by_package.get(name)
        print(f"  {layer_number(name):>2}  {name:<12} {p['modules']:>3} modules {p['lines']:>6} lines"
              + (f"   largest function {big['lines']:>3} lines: {big['module']} {big['function']}" if big else ""))
    print("largest functions:")
    for f in r.largest_functions:
        print(f"  {f['lines']:>4} lines  {f['module']}:{f['line']} {f['function']}")
    i = r.imports_in_functions
    print(f"imports inside functions: {i['total']} ({i['tuner_internal']} tuner-internal, "
          f"{i['tuner_internal_outside_cli']} of them outside the CLI); breaking the rule: {i['breaking_the_rule']}")
    print(f"status literals outside the enum: {r.status_literals_outside_enum}"
          + (f" ({', '.join(f'{k} {v}' for k, v in sorted(r.status_literals_by_module.items()))})"
             if r.status_literals_by_module else ""))
    print(f"imports against the layer map: {len(r.layer_violations)}")
    for v in r.layer_violations[:40]:
        print(f"  {v}")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    args = [a for a in args if a != "--json"]
    package = None
    if "--functions" in args:
        i = args.index("--functions")
        package = args[i + 1]
        del args[i:i + 2]
    r = report(Path(args[0]) if args else PACKAGE_DIR, top=8 if package else 5, package=package)
    if as_json:
        print(json.dumps(r.__dict__, indent=2))
    else:
        _print(r)


if __name__ == "__main__":
    main()
