"""Numbers in word problems: canonical strings, extraction from text, safe arithmetic.

GSM8K writes calculations as ``<<48/2=24>>`` annotations and numbers as ``1,000``, ``$5`` or
``3.50``. Everything here compares numbers by their *canonical string*: no thousands separators,
no trailing decimal zeros, at most :data:`DECIMALS` decimals (``"1000"``, ``"3.5"``, ``"-2"``).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable

DECIMALS = 4
"""Decimals kept by :func:`canonical` (values are rounded half-even to this many)."""

NUMBER_RE = re.compile(r"(?<![\w.])-?\d(?:[\d,]*\d)?(?:\.\d+)?(?![\d])")
"""A number token in prose: ``12``, ``1,000``, ``3.50``, ``-4`` (not the ``2`` of ``x2y``)."""

_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_EXPONENT = 12


def canonical(value: float | int | str) -> str:
    """The canonical string of a number.

    Args:
        value: a number, or a numeric string (commas, a leading ``$`` and spaces allowed).

    Returns:
        e.g. ``canonical(3.50) == "3.5"``, ``canonical("1,000") == "1000"``,
        ``canonical(2.0) == "2"``.

    Raises:
        ValueError: a string that is not a number.
    """
    if isinstance(value, str):
        text = value.strip().replace(",", "").lstrip("$").strip()
        value = float(text)
    rounded = round(float(value), DECIMALS)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.{DECIMALS}f}".rstrip("0").rstrip(".")


def numbers_in(text: str) -> list[str]:
    """Canonical strings of every number token in ``text``, in order of appearance."""
    return [canonical(m.group(0)) for m in NUMBER_RE.finditer(text)]


def safe_eval(expr: str) -> float:
    """Evaluate an arithmetic expression of numbers, ``+ - * / // % **`` and parentheses.

    Args:
        expr: e.g. ``"48/2"``, ``"(3+4)*2"``; commas inside numbers are removed first.

    Returns:
        The value as a float.

    Raises:
        ValueError: anything else (names, calls, huge exponents, division by zero).
    """
    try:
        tree = ast.parse(expr.replace(",", "").strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expr!r}") from e

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            if isinstance(node.value, bool):
                raise ValueError(f"not a number: {node.value!r}")
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent too large in {expr!r}")
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError as e:
                raise ValueError(f"division by zero in {expr!r}") from e
        raise ValueError(f"unsupported element in {expr!r}: {type(node).__name__}")

    return ev(tree.body)
