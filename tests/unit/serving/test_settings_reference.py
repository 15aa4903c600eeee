"""`python -m serving settings`: the settings reference, rendered from the
settings dataclasses, with no blank row: every field carries its comment."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.config import DegradationConfig, GatewayConfig, ReplicaConfig, TierConfig
from layered_settings import field_types, is_group
from serving.cli import main
from serving.settings import SECTIONS
from serving.settings_reference import field_docs, render, tables


def test_every_settings_dataclass_is_in_the_reference_under_its_file_heading():
    headings = {t.heading: t.kind for t in tables()}
    assert {name: headings[name] for name in SECTIONS} == SECTIONS
    assert headings["gateway.degradation"] is DegradationConfig
    assert headings["gateway.tiers.NAME"] is TierConfig and headings["gateway.fleet.replicas.NAME"] is ReplicaConfig


@pytest.mark.parametrize("table", tables(), ids=lambda t: t.heading)
def test_every_field_has_a_description(table):
    docs = field_docs(table.kind)
    blank = [name for name, hint in field_types(table.kind).items() if not is_group(hint) and not docs[name]]
    assert not blank, f"[{table.heading}]: fields without a comment: {', '.join(blank)}"


def test_a_description_joins_the_block_above_and_the_comment_on_the_line():
    docs = field_docs(DegradationConfig)
    assert docs["enter_dwell_s"].startswith("the enter dwell must be at least the window")
    assert docs["max_level"] == "0 turns degradation off; 4 needs a fallback model"
    assert field_docs(GatewayConfig)["ops_port"].startswith("the operational listener's port")


def test_the_command_prints_each_group_with_its_fields_types_and_defaults(capsys):
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert out == render()
    group = out.split("## [gateway.degradation]\n")[1].split("\n## ")[0]
    assert "Degradation under sustained overload" in group
    for f in dataclasses.fields(DegradationConfig):
        assert f"| `{f.name}` |" in group
    assert "| `max_level` | `int` | `4` | 0 turns degradation off; 4 needs a fallback model |" in group
    assert '| `fallback_model` | `str` | `""` |' in group
    assert "| `degradation` |" not in out, "a group is a heading of its own, not a row"
