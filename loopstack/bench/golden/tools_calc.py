"""Golden tools: a calculator (arithmetic only, evaluated on a parsed tree, never eval)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return float(_OPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_eval(node.operand)))
    raise ValueError(f"unsupported expression: {ast.dump(node)[:80]}")


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: One arithmetic expression, such as 12 * (3 + 4).
    """
    value = _eval(ast.parse(expression.replace("^", "**"), mode="eval"))
    return round(value, 6)
