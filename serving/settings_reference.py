"""`python -m serving settings`: the settings reference, rendered from the
settings dataclasses themselves (serving/settings.py's SECTIONS): each
section, group (`[gateway.degradation]`) and table entry (`[gateway.tiers.NAME]`)
with its fields' types, defaults and comments. A field's documentation is the
comment block right above it and the comment on its own line (with that
comment's indented continuation lines), so the models stay the one place where
a setting is explained."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from layered_settings import field_types, is_group

from .settings import SECTIONS


@dataclass(frozen=True)
class Table:
    """One heading of the reference: a section, a group, or a table's entries."""

    heading: str  # as in a settings file: "gateway.degradation", "gateway.tiers.NAME"
    kind: type


def tables() -> list[Table]:
    """Every settings dataclass under the heading a settings file gives it."""
    found: list[Table] = []

    def visit(heading: str, kind: type) -> None:
        found.append(Table(heading, kind))
        for name, hint in field_types(kind).items():
            if is_group(hint):
                visit(f"{heading}.{name}", hint)
            elif typing.get_origin(hint) is dict and is_group(typing.get_args(hint)[1]):
                visit(f"{heading}.{name}.NAME", typing.get_args(hint)[1])

    for section, kind in SECTIONS.items():
        visit(section, kind)
    return found


def field_docs(kind: type) -> dict[str, str]:
    """Each field's comment, from the source of the class that defines it."""
    docs: dict[str, str] = {}
    for cls in reversed(kind.__mro__):
        if dataclasses.is_dataclass(cls):
            docs.update(_class_comments(cls))
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(kind)}


def _class_comments(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {
        token.start[0]: (token.start[1], token.string.lstrip("#").strip())
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }

    def comment_only(number: int) -> bool:
        return number in comments and not lines[number - 1][: comments[number][0]].strip()

    docs: dict[str, str] = {}
    body = typing.cast(ast.ClassDef, ast.parse(source).body[0]).body
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        column, end = node.col_offset, node.end_lineno or node.lineno
        above: list[str] = []
        number = node.lineno - 1  # the block right above, at the field's own indentation
        while comment_only(number) and comments[number][0] == column:
            above.insert(0, comments[number][1])
            number -= 1
        own = [comments[n][1] for n in range(node.lineno, end + 1) if n in comments]
        number = end + 1  # its own comment's continuation lines, indented past the field
        while own and comment_only(number) and comments[number][0] > column:
            own.append(comments[number][1])
            number += 1
        docs[node.target.id] = "; ".join(part for part in (" ".join(above), " ".join(own)) if part)
    return docs


def _own_doc(kind: type) -> str:
    """The class's docstring; not the signature dataclasses write in its absence."""
    doc = kind.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{kind.__name__}(") else inspect.cleandoc(doc)


def _default(field: dataclasses.Field[Any], hint: Any) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    return json.dumps(TypeAdapter(hint).dump_python(value, mode="json"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The reference as Markdown: a table per heading (groups are headings of their own)."""
    out = [
        "# Settings",
        "",
        "Sources, each overriding the one before: the defaults below, a TOML file (`--settings`; a group is a",
        "table: `[gateway.degradation]`), the environment (`LLM__GATEWAY__DEGRADATION__MAX_LEVEL=2`) and",
        "`--set gateway.degradation.max_level=2`. Table entries (`NAME`) take JSON in the environment and `--set`.",
    ]
    for table in tables():
        types, docs = field_types(table.kind), field_docs(table.kind)
        out += ["", f"## [{table.heading}]", ""]
        if doc := _own_doc(table.kind):
            out += [" ".join(doc.split()), ""]
        out += ["| field | type | default | description |", "|---|---|---|---|"]
        for f in dataclasses.fields(table.kind):
            if not is_group(types[f.name]):
                out.append(
                    f"| `{f.name}` | `{_cell(str(f.type))}` | `{_cell(_default(f, types[f.name]))}` "
                    f"| {_cell(docs[f.name])} |"
                )
    return "\n".join(out) + "\n"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "settings",
        help="print the settings reference (every section, group and field, "
        "with its type, default and meaning) as Markdown",
    )
    parser.set_defaults(func=cmd_settings)


def cmd_settings(args: argparse.Namespace) -> int:
    print(render(), end="")
    return 0
