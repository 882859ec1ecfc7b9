"""The package map (tests/arch_tests/structure.py LAYERS) is true, and the README and
docs/architecture.md show it."""

from __future__ import annotations

import re

from tests.arch_tests import structure as s
from tests.conftest import REPO

MODULES = s.modules()
IMPORTS = s.imports(MODULES)
HEAVY = s.heavy_modules(MODULES, IMPORTS)


def test_imports_only_go_down_the_map():
    assert s.layer_violations(IMPORTS) == []


def test_every_package_is_on_the_map_and_the_map_has_no_ghosts():
    units = {m.unit for m in MODULES}
    on_map = {name for layer in s.LAYERS for name in layer}
    assert units - on_map == set(), "add the new package to LAYERS (and to the README's layout)"
    assert on_map - units == set(), "a package on the map does not exist"


def _readme_layers() -> list[tuple[str, ...]]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    rows: dict[int, list[str]] = {}
    for line in block.splitlines():
        m = re.match(r"^\s*(\d+)\s+(.*?)\s{2,}\S", line)
        if not m:
            continue
        names = [n.strip() for n in m.group(2).split(",")]
        rows.setdefault(int(m.group(1)), []).extend(re.sub(r"^tuner/|/$|\.py$", "", n) for n in names)
    return [tuple(rows[k]) for k in sorted(rows, reverse=True)]


def test_the_readme_layout_is_the_map():
    shown = _readme_layers()
    expected = [layer for layer in s.LAYERS if layer not in (("__main__",), ("__init__",))]
    assert [set(layer) for layer in shown] == [set(layer) for layer in expected]


def _architecture_layers() -> dict[int, list[str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    rows: dict[int, list[str]] = {}
    for line in text.split("\n## Packages\n", 1)[1].split("\n## ", 1)[0].splitlines():
        m = re.match(r"^\| (\d+) \| (.*?) \|", line)
        if m:
            rows[int(m.group(1))] = [re.sub(r"/$|\.py$", "", n.strip(" `")) for n in m.group(2).split(",")]
    return rows


def test_the_architecture_page_numbers_the_same_layers():
    expected = [layer for layer in s.LAYERS if layer not in (("__main__",), ("__init__",))]
    numbered = {len(expected) - 1 - i: set(layer) for i, layer in enumerate(expected)}  # as the README numbers them
    assert {k: set(v) for k, v in _architecture_layers().items()} == numbered


def test_imports_inside_functions_are_heavy_libraries_or_command_loading():
    breaking = [f"{i.module}:{i.lineno} imports {i.target}" for i in IMPORTS
                if s.local_import_breaks_rule(i, HEAVY) and i.module not in s.LOCAL_IMPORTS_TO_MOVE]
    assert breaking == [], "import it at the top of the module (or add the library to HEAVY_LIBRARIES if it is one)"
    for module, count in s.LOCAL_IMPORTS_TO_MOVE.items():  # may only shrink
        now = sum(1 for i in IMPORTS if i.module == module and s.local_import_breaks_rule(i, HEAVY))
        assert now <= count, f"{module} has {now} imports inside functions that break the rule, at most {count}"


def test_no_trial_or_study_status_is_spelt_outside_the_enum():
    found = [f"{lit.module}:{lit.lineno}: {lit.word!r}" for lit in s.status_literals(MODULES)]
    assert found == [], "use tuner.lifecycle.TrialStatus / StudyStatus"


def test_the_checks_find_what_they_look_for(tmp_path):
    pkg = tmp_path / "tuner"
    (pkg / "workload").mkdir(parents=True)
    (pkg / "study").mkdir()
    (pkg / "workload" / "bad.py").write_text("from tuner.study import runner\n")
    (pkg / "study" / "lit.py").write_text('def f(t):\n    """complete"""\n    import json\n'
                                          '    return t.status == "complete"\n')
    mods = s.modules(pkg)
    assert s.layer_violations(s.imports(mods)) == [
        "workload/bad.py:1: workload imports tuner.study (a higher layer)"]
    assert [(lit.module, lit.word) for lit in s.status_literals(mods)] == [("study/lit.py", "complete")]
    imps = s.imports(mods)
    assert [i.target for i in imps if s.local_import_breaks_rule(i, s.heavy_modules(mods, imps))] == ["json"]
