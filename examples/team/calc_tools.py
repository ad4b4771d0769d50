"""Example tools for the `calc` worker: exact arithmetic."""

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
    ast.USub: operator.neg,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_eval(node.left), _eval(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_eval(node.operand)))
    raise ValueError("only numbers and + - * / are allowed")


def calculate(expression: str) -> dict:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers with + - * / and parentheses, for example (7300 / 44600) * 100.
    """
    value = _eval(ast.parse(expression, mode="eval").body)
    return {"expression": expression, "value": round(value, 4)}
