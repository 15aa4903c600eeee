"""The client library ships alone: of the project it imports only `contract`
(the wire format), never the text stages, the gateway, the launcher or the engine."""

from __future__ import annotations

import ast
from pathlib import Path

import client

PROJECT_PACKAGES = {"ensemble", "gateway", "serving", "python_llm", "loadtest", "bench"}


def test_the_client_imports_no_project_package_but_contract() -> None:
    for path in sorted(Path(client.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & PROJECT_PACKAGES, f"{path.name} imports {sorted(roots & PROJECT_PACKAGES)}"
