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


MAX_CHARS = 1_000
MAX_NODES = 200
MAX_DEPTH = 32
MAX_INT_BITS = 256


class ExpressionError(ValueError):
    pass


def var_name(knob: str) -> str:
    return knob.replace("-", "_")


_ALLOWED = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Constant, ast.Load,
            ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd, ast.Tuple, ast.List, *_BINOPS, *_CMPOPS)


def _short(source: str) -> str:
    return repr(source) if len(source) <= 80 else repr(source[:77] + "...")


def parse(source: str) -> ast.Expression:
    if not isinstance(source, str):
        raise ExpressionError(f"an expression must be a string, got {type(source).__name__}")
    if len(source) > MAX_CHARS:
        raise ExpressionError(f"expression {_short(source)} is {len(source):,} characters long; at most {MAX_CHARS:,}")
    return _parse(source)


@lru_cache(maxsize=512)
def _parse(source: str) -> ast.Expression:
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte
        raise ExpressionError(f"invalid expression {_short(source)}: {getattr(exc, 'msg', exc)}") from None
    except (RecursionError, MemoryError):
        raise ExpressionError(f"expression {_short(source)} is nested too deeply; at most {MAX_DEPTH} levels") from None
    count = 0
    stack = [(tree, 0)]  # iterative: depth is checked before anything recurses
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ExpressionError(f"expression {_short(source)} has more than {MAX_NODES} terms; split it into "
                                  "several constraints")
        if depth > MAX_DEPTH:
            raise ExpressionError(f"expression {_short(source)} is nested more than {MAX_DEPTH} levels deep")
        if not isinstance(node, _ALLOWED):
            raise ExpressionError(f"{_short(source)}: {type(node).__name__} is not allowed in an expression")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (type(None), bool, int, float, str)):
            raise ExpressionError(f"{_short(source)}: constant {node.value!r:.40} is not allowed")
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and node.value.bit_length() > MAX_INT_BITS:
            raise ExpressionError(f"{_short(source)}: number too large")
        if isinstance(node, ast.BinOp) and any(isinstance(side, ast.Constant) and isinstance(side.value, str)
                                               for side in (node.left, node.right)):
            raise ExpressionError(f"{_short(source)}: arithmetic on a string is not allowed")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
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
            raise ExpressionError(f"{_short(src)}: unknown name {node.id!r}; known: {', '.join(sorted(env))}")
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env, src) for e in node.elts)
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env, src) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, src)
        if isinstance(node.op, ast.Not):
            return not v
        if not isinstance(v, (int, float)):
            raise ExpressionError(f"{_short(src)}: a sign needs a number, got {v!r:.40}")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env, src), _eval(node.right, env, src)
        for side in (left, right):
            if not isinstance(side, (int, float)):
                raise ExpressionError(f"{_short(src)}: arithmetic needs numbers, got {side!r:.40}")
        try:
            out = _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError) as exc:
            raise ExpressionError(f"{_short(src)}: {exc}") from None
        if isinstance(out, int) and out.bit_length() > MAX_INT_BITS:
            raise ExpressionError(f"{_short(src)}: number too large")
        return out
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
    raise ExpressionError(f"{_short(src)}: unsupported syntax")
