"""A tiny, safe evaluator for the spec's constraint and shape expressions.

The grammar is a subset of Python expressions, parsed with :mod:`ast` and evaluated by walking
the tree -- ``eval`` is never used:

* names (knobs and dims), integer / float / string literals;
* ``+ - * // %`` and unary ``-``;
* ``min(...)`` and ``max(...)``;
* comparisons (``== != < <= > >=``, chains allowed), ``and``, ``or``, ``not``.

Anything else (attribute access, calls to other functions, ``/``, ``**``, subscripts, lambdas, ...)
is rejected when the expression is compiled, with a message that says what is allowed.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Expr", "ExprError", "ALLOWED_SYNTAX"]

ALLOWED_SYNTAX = "names, numbers, 'strings', + - * // %, min(), max(), == != < <= > >=, and, or, not"

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max}

_Env = Mapping[str, Any]
_Fn = Callable[[_Env], Any]


class ExprError(ValueError):
    """An expression that is not in the allowed grammar, or that cannot be evaluated."""


def _symbol(node: ast.AST) -> str:
    op = type(node).__name__
    return {"Div": "/", "Pow": "**", "MatMult": "@", "BitAnd": "&", "BitOr": "|", "BitXor": "^",
            "LShift": "<<", "RShift": ">>", "Is": "is", "IsNot": "is not", "In": "in",
            "NotIn": "not in", "Invert": "~", "UAdd": "unary +"}.get(op, op)


def _compile(node: ast.AST, names: set[str]) -> _Fn:
    """Turn a checked AST node into a closure ``env -> value``; raise ExprError on disallowed syntax."""
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ExprError(f"literal {value!r} is not allowed; allowed: {ALLOWED_SYNTAX}")
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        if name in _FUNCS:
            raise ExprError(f"'{name}' must be called, e.g. {name}(a, b)")
        names.add(name)

        def lookup(env: _Env) -> Any:
            try:
                return env[name]
            except KeyError:
                raise ExprError(f"no value for '{name}'") from None

        return lookup
    if isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise ExprError(f"operator '{_symbol(node.op)}' is not allowed; allowed: {ALLOWED_SYNTAX}")
        left, right = _compile(node.left, names), _compile(node.right, names)

        def binop(env: _Env) -> Any:
            a, b = left(env), right(env)
            try:
                return op(a, b)
            except ZeroDivisionError:
                raise ExprError("division by zero") from None
            except TypeError as e:
                raise ExprError(f"cannot apply '{_symbol(node.op)}' to {a!r} and {b!r}") from e

        return binop
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand, names)
        if isinstance(node.op, ast.USub):
            return lambda env: -operand(env)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        raise ExprError(f"operator '{_symbol(node.op)}' is not allowed; allowed: {ALLOWED_SYNTAX}")
    if isinstance(node, ast.BoolOp):
        parts = [_compile(v, names) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(bool(p(env)) for p in parts)
        return lambda env: any(bool(p(env)) for p in parts)
    if isinstance(node, ast.Compare):
        ops = []
        for op_node in node.ops:
            op = _CMPOPS.get(type(op_node))
            if op is None:
                raise ExprError(f"comparison '{_symbol(op_node)}' is not allowed; allowed: {ALLOWED_SYNTAX}")
            ops.append(op)
        first = _compile(node.left, names)
        rest = [_compile(c, names) for c in node.comparators]

        def compare(env: _Env) -> bool:
            a = first(env)
            for op, get_b in zip(ops, rest):
                b = get_b(env)
                try:
                    if not op(a, b):
                        return False
                except TypeError as e:
                    raise ExprError(f"cannot compare {a!r} with {b!r}") from e
                a = b
            return True

        return compare
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            raise ExprError(f"only min() and max() may be called; allowed: {ALLOWED_SYNTAX}")
        if node.keywords or len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"{node.func.id}() takes two or more plain arguments")
        fn = _FUNCS[node.func.id]
        args = [_compile(a, names) for a in node.args]
        return lambda env: fn(*(a(env) for a in args))
    raise ExprError(f"{type(node).__name__} syntax is not allowed; allowed: {ALLOWED_SYNTAX}")


@dataclass(frozen=True, eq=False)
class Expr:
    """A compiled expression: ``Expr("a % b == 0").names == {"a", "b"}``; ``expr({"a": 4, "b": 2})``."""

    source: str
    names: frozenset[str]
    _fn: _Fn

    @classmethod
    def parse(cls, source: str) -> "Expr":
        if not isinstance(source, str) or not source.strip():
            raise ExprError("expression must be a non-empty string")
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as e:
            raise ExprError(f"not a valid expression ({e.msg}); allowed: {ALLOWED_SYNTAX}") from None
        names: set[str] = set()
        fn = _compile(tree.body, names)
        return cls(source.strip(), frozenset(names), fn)

    def __call__(self, env: _Env) -> Any:
        return self._fn(env)

    def evaluate_bool(self, env: _Env) -> bool:
        """Evaluate a condition; a non-boolean result (e.g. ``a % b``) is an error, not a truthy value."""
        value = self._fn(env)
        if not isinstance(value, bool):
            raise ExprError(f"'{self.source}' must be a true/false condition, but gave {value!r}")
        return value
