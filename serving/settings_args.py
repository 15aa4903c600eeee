"""The settings options every `python -m serving` command that renders or
runs a deployment takes (--model-dir, --settings, --set), and the settings
they make."""

from __future__ import annotations

import argparse
from typing import Any

from .default_model import resolve_model_dir
from .settings import DeploymentSettings, SettingsError


def add_settings_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", help="a local HF causal-LM folder (default: $LLM_MODEL_DIR or SmolLM2-135M)")
    parser.add_argument(
        "--settings", metavar="FILE.toml", help="a settings file with [engine], [text], [server] and [gateway] tables"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override a setting, e.g. --set engine.dtype=bfloat16, --set "
        "gateway.degradation.max_level=2 (repeatable; beats the settings file and "
        "LLM__SECTION__FIELD environment variables); `python -m serving settings` lists them",
    )


def settings_from_args(args: argparse.Namespace) -> DeploymentSettings:
    overrides: dict[str, Any] = {"engine.model_dir": str(resolve_model_dir(args.model_dir))} if args.model_dir else {}
    try:
        return DeploymentSettings.load(
            settings_file=args.settings,
            assignments=args.set or [],
            default_model_dir=lambda: str(resolve_model_dir(None)),
            **overrides,
        )
    except SettingsError as exc:
        raise SystemExit(f"error: {exc}") from None
