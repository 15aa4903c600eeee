"""The JSON of a Triton HTTP body, parsed strictly (gateway/bodies/strict_json.py),
every refusal a 400 naming the field as a Triton caller knows it: the
top-level key, or in an infer body the input (or output) whose tensor holds
the problem. Numbers stay as written (`2.0` is a float, refused where an
integer is due), as Triton reads them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..bodies import strict_json
from ..bodies.strict_json import path_text, shown
from ..core.errors import GatewayError


def parse(raw: bytes) -> Any:
    """The document, or a GatewayError(400) naming the field that is wrong."""
    try:
        return strict_json.parse(raw)
    except strict_json.NotJSON as exc:
        raise GatewayError(400, f"The body is not valid JSON: {exc.detail}") from None
    except strict_json.Unfit as exc:
        name = _field(exc.document, exc.path)
        where = path_text(exc.path)
        at = f" (at {where})" if where != name else ""
        raise GatewayError(400, f"{name}: {exc.what}{at}", param=name) from None


def _field(document: Any, path: Sequence[str | int]) -> str:
    """The field a caller knows: the top-level key, or in an infer body the
    tensor's input (or output) name when it has a clean one."""
    if not path:
        return "body"
    if len(path) >= 3 and path[0] in ("inputs", "outputs") and isinstance(path[1], int) and path[2] != "name":
        tensor = document[path[0]][path[1]]
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if isinstance(name, str) and strict_json.is_utf8(name):
            return shown(name)
    return path_text(path[:1]) if len(path) == 1 or path[0] not in ("inputs", "outputs") else path_text(path[:3])
