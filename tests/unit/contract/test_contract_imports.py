"""`contract` is what every side imports, so it imports nothing of the
project: only the standard library and numpy."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import contract

ALLOWED_THIRD_PARTY = {"numpy"}


def test_contract_imports_only_the_standard_library_and_numpy() -> None:
    package = Path(contract.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            outside = roots - set(sys.stdlib_module_names) - ALLOWED_THIRD_PARTY - {"__future__"}
            assert not outside, f"{path.name} imports {sorted(outside)}"
