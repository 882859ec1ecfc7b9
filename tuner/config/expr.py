"""Tiny, safe expression language for search-space conditions and constraints.

Expressions are Python syntax restricted to names, numbers, strings, None, True/False, arithmetic
(+ - * / // %), comparisons, ``in``, ``and``/``or``/``not``. Knob names use underscores in place of
dashes (``attn_dp_size > 1``). Nothing else is evaluated: no calls, attributes or subscripts.
"""

from __future__ import annotations

import ast
import operator
from functools import lru_cache

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_CMPOPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}


class ExpressionError(ValueError):
    pass


def var_name(knob: str) -> str:
    return knob.replace("-", "_")


@lru_cache(maxsize=512)
def parse(source: str) -> ast.Expression:
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"invalid expression {source!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare,
                                 ast.Name, ast.Constant, ast.Load, ast.And, ast.Or, ast.Not,
                                 ast.USub, ast.UAdd, ast.Tuple, ast.List, *_BINOPS, *_CMPOPS)):
            raise ExpressionError(f"{source!r}: {type(node).__name__} is not allowed in an expression")
    return tree


def names(source: str) -> set[str]:
    return {n.id for n in ast.walk(parse(source)) if isinstance(n, ast.Name)}


def evaluate(source: str, variables: dict):
    """Evaluate ``source``; a name that is not in ``variables`` raises ExpressionError."""
    return _eval(parse(source).body, variables, source)


def _eval(node, env, src):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExpressionError(f"{src!r}: unknown name {node.id!r}; known: {', '.join(sorted(env))}")
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env, src) for e in node.elts)
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env, src) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, src)
        return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env, src), _eval(node.right, env, src)
        try:
            return _BINOPS[type(node.op)](left, right)
        except (TypeError, ZeroDivisionError) as exc:
            raise ExpressionError(f"{src!r}: {exc}") from None
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, src)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, src)
            try:
                if not _CMPOPS[type(op)](left, right):
                    return False
            except TypeError:
                return False  # e.g. None > 1: the condition does not hold
            left = right
        return True
    raise ExpressionError(f"{src!r}: unsupported syntax")
