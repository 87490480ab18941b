"""Options several commands share: the config file and its overrides."""

from __future__ import annotations

import click

from b2t.paths import RegularFile

config_option = click.option(
    "--config", "config_path", type=RegularFile(),
    help="YAML config (configs/baseline.yaml is the reference recipe, configs/tiny.yaml the demo).",
)
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
    help="Override one config value, e.g. --set train.steps=500 (repeatable).",
)
