"""``polar check CONFIG_OR_SPEC``: does this harness follow the environment contract?

CONFIG_OR_SPEC is a run config (its ``harness:`` section is checked), a YAML file holding just a
harness section, a connector class as ``module:ClassName`` (resolved in the working directory), or a
registered Gymnasium id. Exits 0 when the harness conforms, 1 when it does not.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from polar.errors import ConfigError

HELP = "check that an environment harness (Gymnasium id, connector, or config) follows the env contract"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="CONFIG_OR_SPEC", help="config YAML, module:ClassName, or a Gymnasium id")
    parser.add_argument("--steps", type=int, default=300, help="random-action steps to run (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. -o harness.connector_spec.config.level=2")


def resolve_target(target: str, overrides: list[str] | None = None) -> tuple[Any, Path]:
    """CONFIG_OR_SPEC -> (harness config, directory that user modules resolve against)."""
    from polar.config.base import StrictModel, validate
    from polar.config.harness import HarnessConfig
    from polar.config.loader import apply_overrides, read_yaml_file

    class _HarnessOnly(StrictModel):
        harness: HarnessConfig

    path = Path(target)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        data = apply_overrides(read_yaml_file(path), overrides)
        section = data.get("harness") if "harness" in data else data
        cfg = validate(_HarnessOnly, {"harness": section}, source=str(path)).harness
        config_dir = path.resolve().parent
    elif ":" in target:
        module, _, class_name = target.partition(":")
        if not module or not class_name:
            raise ConfigError(f"{target!r}: a connector spec looks like module:ClassName, e.g. my_game_connector:MyGameConnector")
        data = apply_overrides({"harness": {"type": "custom", "connector_spec": {"module": module, "class_name": class_name}}}, overrides)
        cfg = validate(_HarnessOnly, data, source=target).harness
        config_dir = Path.cwd()
    else:
        cfg = validate(_HarnessOnly, {"harness": {"type": "gymnasium", "id": target}}, source=target).harness
        config_dir = Path.cwd()
    if cfg.type not in ("gymnasium", "custom"):
        raise ConfigError(f"{target}: polar check covers environment harnesses (gymnasium, custom), not type {cfg.type!r}")
    return cfg, config_dir


def main(args: argparse.Namespace) -> int:
    from polar.cli._progress import cli_console
    from polar.harness.checker import check_harness

    cfg, config_dir = resolve_target(args.target, args.override)
    console = cli_console(stderr=False, emoji=False)
    target = escape(args.target)
    with console.status(f"checking {target} ..."):
        report = check_harness(cfg, config_dir=config_dir, steps=args.steps, seed=args.seed)
    for line in report.passed:
        console.print(f"[green]✓[/] {escape(line)}", highlight=False)
    for line in report.warnings:
        console.print(f"[yellow]![/] {escape(line)}", highlight=False)
    for v in report.violations:
        console.print(f"[red]✗ {v.check}[/]", highlight=False)
        console.print(f"    expected: {v.expected}", markup=False, highlight=False)
        console.print(f"    received: {v.received}", markup=False, highlight=False)
        console.print(f"    fix:      {v.fix}", markup=False, highlight=False)
        if v.details:  # the connector's traceback and last output lines, as `polar run` shows them
            console.print("    connector output:", markup=False, highlight=False)
            for line in v.details.splitlines():
                console.print(f"      {line}", markup=False, highlight=False, soft_wrap=True)
    if report.ok:
        console.print(f"[bold green]{escape(report.target)} conforms[/] ({len(report.passed)} checks passed)", highlight=False)
        return 0
    console.print(f"[bold red]{escape(report.target)}: {len(report.violations)} violation(s)[/]", highlight=False)
    return 1
