"""Extract SGLang's server flags from a wheel, statically (the wheel is never imported).

SGLang 0.5.23 declares its flags as msgspec fields in ``sglang/srt/arg_groups/fields/*.py``;
0.5.17 declares the same kind of fields in the ``ServerArgs`` class of ``srt/server_args.py``::

    tp_size: A[int, Arg(help=..., aliases=["--tensor-parallel-size"])] = 1
    nnodes: A[int, "The number of nodes."] = 1          # bare help string = Arg(help=...)

and ``ServerArgs.add_cli_args`` (``srt/server_args.py``) registers a few more with
``parser.add_argument``. ``add_cli_args_from_dataclass`` (``arg_groups/arg_utils.py``) turns a
field into an argparse action: ``bool`` -> store_true, ``Literal`` -> choices, ``List[X]`` ->
``nargs="+"``, an explicit ``action=`` as given; fields without ``Arg`` or help string, or with
``no_cli=True``, get no flag. This module repeats that mapping on the AST and records, per flag,
whether it may appear in a ``--config`` YAML. That differs by version:

* 0.5.23 (``srt/utils/server_args_config_parser.py``) accepts store_true and every single-value
  or list action under any long spelling; BooleanOptionalAction and other zero-argument custom
  actions raise "Unsupported config option".
* 0.5.17 (``srt/server_args_config_parser.py``) keys YAML by ``dest`` and accepts only plain
  store_true and store actions: any custom action (the deprecated aliases among them) makes its
  ``dest`` unsupported, which also blocks the real flag sharing that ``dest``
  (``--cuda-graph-max-bs-decode`` shares ``cuda_graph_max_bs_decode`` with the deprecated
  ``--cuda-graph-max-bs``). Such flags must go on the command line.

Run: ``tuner sglang extract-flags WHEEL -o tuner/catalog/sglang-flags-<version>.json``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import zipfile
from pathlib import Path
from typing import Any

FIELDS_PREFIX = "sglang/srt/arg_groups/fields/"
CONFIG_PARSER_MODULES = ("sglang/srt/utils/server_args_config_parser.py",
                         "sglang/srt/server_args_config_parser.py")
CHOICES_MODULE = "sglang/srt/arg_groups/choices.py"
SERVER_ARGS_MODULE = "sglang/srt/server_args.py"

# type_parser callables whose value type is known
_PARSER_TYPES = {
    "human_readable_int": "int",
    "json.loads": "json",
    "json_list_type": "json",
    "parse_cuda_graph_config_arg": "json",
    "parse_cuda_graph_backend_arg": "str",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ast.unparse(node)


class _Consts:
    """Module-level list/tuple constants (choice lists) resolvable by name."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {}

    def add_module(self, tree: ast.Module) -> None:
        for node in tree.body:
            targets, value = [], None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            for t in targets:
                if isinstance(t, ast.Name):
                    resolved = self.resolve(value)
                    if isinstance(resolved, (set, frozenset)):
                        resolved = sorted(resolved, key=str)
                    if isinstance(resolved, list):
                        self.values[t.id] = resolved

    def resolve(self, node: ast.AST | None) -> Any:
        """A literal value, a known constant by name, or list concatenations of those."""
        if node is None:
            return None
        if isinstance(node, ast.Name) and node.id in self.values:
            return list(self.values[node.id])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.resolve(node.left), self.resolve(node.right)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            return _UNKNOWN
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self.resolve(e) for e in node.elts]
            if isinstance(node, ast.Set) and all(isinstance(i, str) for i in items):
                items = sorted(items)
            if any(i is _UNKNOWN for i in items):
                return _UNKNOWN
            return items
        if isinstance(node, ast.Starred):
            return _UNKNOWN
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return _UNKNOWN


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


_UNKNOWN = _Unknown()


def _parse_type(node: ast.AST) -> dict:
    """Describe an annotation: {'type': int|float|str|bool|list|json|other, 'literal': [...]}."""
    optional = False
    # Optional[X] / X | None
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("Optional", "typing.Optional"):
        optional, node = True, node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [node.left, node.right]
        non_none = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        if len(non_none) == 1:
            optional, node = True, non_none[0]
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("Union", "typing.Union"):
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        non_none = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(non_none) < len(elts):
            optional = True
        if len(non_none) == 1:
            node = non_none[0]
        else:
            return {"type": "other", "optional": optional, "annotation": ast.unparse(node)}
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("Literal", "typing.Literal"):
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        vals = [ast.literal_eval(e) for e in elts]
        if None in vals:
            optional = True
        first = next((v for v in vals if v is not None), None)
        # arg_utils infers the argparse type from the first literal value
        kind = {bool: "bool", int: "int", float: "float"}.get(type(vals[0]), "str")
        del first
        return {"type": kind, "optional": optional, "literal": vals}
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("List", "list", "typing.List"):
        elem = _dotted(node.slice) if not isinstance(node.slice, ast.Tuple) else "str"
        return {"type": "list", "optional": optional, "element": elem if elem in ("int", "float", "str") else "str"}
    name = _dotted(node)
    if name in ("int", "float", "str", "bool"):
        return {"type": name, "optional": optional}
    if name in ("List", "list"):
        return {"type": "list", "optional": optional, "element": "str"}
    return {"type": "other", "optional": optional, "annotation": ast.unparse(node)}


def _arg_meta(node: ast.AST, consts: _Consts) -> dict | None:
    """The ``Arg(...)`` (or bare help string) metadata inside ``A[T, ...]``; None = no CLI."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {"help": node.value}
    if isinstance(node, ast.JoinedStr):
        return {"help": ast.unparse(node)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "a" "b" + ... help text
        return {"help": ast.unparse(node)}
    if isinstance(node, ast.Call) and _dotted(node.func) == "Arg":
        meta: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg in ("help",):
                v = consts.resolve(kw.value)
                meta["help"] = v if isinstance(v, str) else ast.unparse(kw.value)
            elif kw.arg in ("aliases", "choices", "nargs", "cli_name", "no_cli", "required", "const"):
                meta[kw.arg] = consts.resolve(kw.value)
            elif kw.arg in ("action", "type_parser"):
                meta[kw.arg] = _dotted(kw.value)
            elif kw.arg == "action_kwargs":
                meta[kw.arg] = ast.unparse(kw.value)
        return meta
    return None


def _config_yaml_mode(kind: str, action: str | None, nargs: Any) -> str:
    """How ``--config`` YAML treats the flag: store_true, value, list or unsupported."""
    if kind == "store_true":
        return "store_true"
    if action is None:
        return "list" if nargs in ("+", "*") else "value"
    # custom action: the parser accepts it only with nargs None (one value)
    if action.endswith("BooleanOptionalAction"):
        return "unsupported"
    return "value" if nargs is None and action not in ("DeprecatedStoreTrueAction", "DeprecatedAction") \
        else "unsupported"


def _flag_from_field(name: str, ann: ast.Subscript, default: ast.AST | None, consts: _Consts,
                     source: str, namespace: str | None) -> dict | None:
    if not (isinstance(ann, ast.Subscript) and _dotted(ann.value) in ("A", "Annotated")):
        return None
    elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if len(elts) < 2:
        return None
    meta = None
    for extra in elts[1:]:
        meta = _arg_meta(extra, consts)
        if meta is not None:
            break
    if meta is None or meta.get("no_cli") is True:
        return None
    for extra in elts[1:]:  # 0.5.17: A[T, "help", NS("parallel")]
        if isinstance(extra, ast.Call) and _dotted(extra.func) == "NS" and extra.args:
            ns = consts.resolve(extra.args[0])
            namespace = ns if isinstance(ns, str) else namespace
    t = _parse_type(elts[0])
    cli = (meta.get("cli_name") or "--" + name.replace("_", "-")).lstrip("-")
    aliases = [a.lstrip("-") for a in (meta.get("aliases") or []) if isinstance(a, str)]
    action = meta.get("action")
    nargs = meta.get("nargs")
    kw_nargs = re.search(r"['\"]nargs['\"]:\s*['\"]([*+?])['\"]", meta.get("action_kwargs") or "")
    if nargs is None and kw_nargs:  # Arg(action=..., action_kwargs={"nargs": "*"})
        nargs = kw_nargs.group(1)
    choices = meta.get("choices")
    if choices is _UNKNOWN:
        choices_out, dynamic = None, True
    else:
        choices_out, dynamic = choices, False
    if choices_out is None and not dynamic and "literal" in t:
        choices_out = t["literal"]
    if action is not None:
        kind = "boolean_optional" if action.endswith("BooleanOptionalAction") else "custom_action"
        vtype = "bool" if kind == "boolean_optional" else (
            t["type"] if t["type"] in ("int", "float", "str", "bool") else "str")
    elif t["type"] == "list" and not meta.get("type_parser"):
        kind, vtype, nargs = "list", t.get("element", "str"), nargs or "+"
    elif t["type"] == "bool" and "literal" not in t:
        kind, vtype = "store_true", "bool"
    else:
        kind = "value"
        vtype = _PARSER_TYPES.get(meta.get("type_parser") or "", None) or (
            t["type"] if t["type"] in ("int", "float", "str", "bool") else "str")
    dflt = consts.resolve(default) if default is not None else None
    entry = {
        "field": name,
        "aliases": aliases,
        "kind": kind,
        "type": vtype,
        "choices": choices_out,
        "choices_dynamic": dynamic,
        "nargs": nargs,
        "optional": t.get("optional", False),
        "default": None if dflt is _UNKNOWN else dflt,
        "default_static": dflt is not _UNKNOWN,
        "action": action,
        "type_parser": meta.get("type_parser"),
        "config_yaml": _config_yaml_mode(kind, action, nargs),
        "namespace": namespace,
        "source": source,
    }
    return {cli: entry}


def _namespace_of(cls: ast.ClassDef) -> str | None:
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _fields_flags(tree: ast.Module, consts: _Consts, source: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        ns = _namespace_of(cls)
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                flag = _flag_from_field(node.target.id, node.annotation, node.value, consts, source, ns)
                if flag:
                    out.update(flag)
    return out


def _add_argument_flags(tree: ast.Module, consts: _Consts, source: str) -> dict[str, dict]:
    """``parser.add_argument("--x", ...)`` calls inside ``ServerArgs.add_cli_args``."""
    out: dict[str, dict] = {}
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "add_cli_args"):
            continue
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "add_argument"):
                continue
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            longs = [n.lstrip("-") for n in names if n.startswith("--")]
            if not longs:
                continue
            kw = {k.arg: k.value for k in call.keywords if k.arg}
            action = None
            if "action" in kw:
                action = consts.resolve(kw["action"])
                if action is _UNKNOWN or not isinstance(action, str):
                    action = _dotted(kw["action"])
            nargs = consts.resolve(kw.get("nargs")) if "nargs" in kw else None
            vtype = _dotted(kw["type"]) if "type" in kw else ("bool" if action == "store_true" else "str")
            choices = consts.resolve(kw.get("choices")) if "choices" in kw else None
            if action == "store_true":
                kind = "store_true"
            elif action == "DeprecatedStoreTrueAction":
                kind, vtype = "custom_action", "bool"
            elif action is None or action == "store":
                kind = "list" if nargs in ("+", "*") else "value"
                action = None
            elif action.endswith("BooleanOptionalAction"):
                kind = "boolean_optional"
            else:
                kind = "custom_action"
            dest = consts.resolve(kw.get("dest")) if "dest" in kw else longs[0].replace("-", "_")
            out[longs[0]] = {
                "field": dest if isinstance(dest, str) else longs[0].replace("-", "_"),
                "aliases": longs[1:],
                "kind": kind,
                "type": vtype if vtype in ("int", "float", "str", "bool") else "str",
                "choices": None if choices is _UNKNOWN else choices,
                "choices_dynamic": choices is _UNKNOWN,
                "nargs": None if nargs is _UNKNOWN else nargs,
                "optional": True,
                "default": None,
                "default_static": False,
                "action": action,
                "type_parser": None,
                "config_yaml": "unsupported" if longs[0] == "config" else _config_yaml_mode(kind, action, nargs),
                "deprecated": bool(action and action.startswith("Deprecated")),
                "namespace": None,
                "source": source,
            }
    return out


def _server_args_fields(tree: ast.Module, consts: _Consts, source: str) -> dict[str, dict]:
    """0.5.17 layout: the annotated fields of ``class ServerArgs`` in ``srt/server_args.py``."""
    out: dict[str, dict] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                flag = _flag_from_field(node.target.id, node.annotation, node.value, consts, source, None)
                if flag:
                    out.update(flag)
    return out


def _apply_config_rules(flags: dict[str, dict], parser_source: str | None) -> str:
    """Set each flag's ``config_yaml`` by the version's config parser; return the rule's name."""
    if parser_source is not None and "_config_keys" in parser_source:
        return "any-spelling"  # 0.5.23: _convert_config_to_args keys by every long option
    # 0.5.17: keyed by dest; a dest that any custom action uses is unsupported for every flag on it
    blocked = {e["field"] for e in flags.values()
               if e["kind"] not in ("store_true", "value", "list") and e.get("action") is not None}
    blocked |= {e["field"] for e in flags.values() if e["kind"] in ("custom_action", "boolean_optional")}
    for name, e in flags.items():
        if name == "config":
            continue
        if e["field"] in blocked:
            e["config_yaml"] = "unsupported"
            e["config_yaml_reason"] = (f"SGLang's config parser keys YAML by dest {e['field']!r}, which a "
                                       f"custom or deprecated action also uses")
        elif e["kind"] == "store_true":
            e["config_yaml"] = "store_true"
        else:
            e["config_yaml"] = "list" if e["kind"] == "list" else "value"
    return "dest-store-only"


def extract_from_wheel(wheel_path: str | Path) -> dict:
    """Every ``sglang serve`` flag declared in the wheel, with aliases, kinds, types, choices."""
    wheel_path = Path(wheel_path)
    digest = hashlib.sha256(wheel_path.read_bytes()).hexdigest()
    m = re.match(r"sglang-([^-]+)-", wheel_path.name)
    with zipfile.ZipFile(wheel_path) as zf:
        names = set(zf.namelist())
        if SERVER_ARGS_MODULE not in names:
            raise ValueError(f"{wheel_path}: no {SERVER_ARGS_MODULE} (not an SGLang wheel?)")
        field_files = sorted(n for n in names if n.startswith(FIELDS_PREFIX) and n.endswith(".py")
                             and not n.endswith("__init__.py"))
        consts = _Consts()
        if CHOICES_MODULE in names:
            consts.add_module(ast.parse(zf.read(CHOICES_MODULE)))
        trees = {n: ast.parse(zf.read(n)) for n in field_files}
        for tree in trees.values():
            consts.add_module(tree)
        sa_tree = ast.parse(zf.read(SERVER_ARGS_MODULE))
        consts.add_module(sa_tree)
        flags: dict[str, dict] = {}
        for n, tree in trees.items():
            flags.update(_fields_flags(tree, consts, n.removeprefix("sglang/")))
        sa_source = SERVER_ARGS_MODULE.removeprefix("sglang/")
        if not field_files:  # 0.5.17 and earlier: fields on ServerArgs itself
            flags.update(_server_args_fields(sa_tree, consts, sa_source))
        for name, entry in _add_argument_flags(sa_tree, consts, sa_source).items():
            flags.setdefault(name, entry)
        parser_module = next((p for p in CONFIG_PARSER_MODULES if p in names), None)
        parser_source = zf.read(parser_module).decode() if parser_module else None
    if not flags:
        raise ValueError(f"{wheel_path}: found no server flags")
    rule = _apply_config_rules(flags, parser_source)
    flags = {k: flags[k] for k in sorted(flags)}
    return {
        "sglang_version": m.group(1) if m else None,
        "wheel": wheel_path.name,
        "wheel_sha256": digest,
        "extracted_from": [f.removeprefix("sglang/") for f in field_files] + [sa_source],
        "config_parser": parser_module.removeprefix("sglang/") if parser_module else None,
        "config_yaml_rule": rule,
        "flag_count": len(flags),
        "flags": flags,
    }
