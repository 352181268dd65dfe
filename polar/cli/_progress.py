"""Rich progress bar for training runs (steps, fps, mean return, ETA) and the eval table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table


class TrainingProgress:
    def __init__(self, total_env_steps: int, start_steps: int = 0, enabled: bool = True, metric_names: list[str] | None = None) -> None:
        self.console = Console(stderr=True)
        self.metric_names = metric_names or ["episode_reward_mean"]
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
            TextColumn("{task.fields[fps]:>7} fps"), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, disable=not enabled, transient=False,
        )
        self.task = self.progress.add_task("train", total=total_env_steps, completed=start_steps, fps="-", info="")

    def __enter__(self) -> TrainingProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, m: dict[str, Any]) -> None:
        parts = []
        for name in self.metric_names:
            v = m.get(name)
            if v is not None:
                parts.append(f"{name.replace('episode_', '').replace('_mean', '')} {v:.3g}")
        self.progress.update(self.task, completed=m["env_steps"], fps=f"{m['fps']:.0f}", info="  ".join(parts))


def print_eval(result: dict[str, Any], title: str = "evaluation") -> None:
    table = Table(title=title, show_header=True)
    for col in ("episodes", "return mean", "return std", "length mean", "success rate"):
        table.add_column(col, justify="right")
    sr = result.get("success_rate")
    table.add_row(str(result["episodes"]), f"{result['return_mean']:.2f}", f"{result['return_std']:.2f}",
                  f"{result['length_mean']:.1f}", "-" if sr is None else f"{100 * sr:.1f}%")
    Console().print(table)
