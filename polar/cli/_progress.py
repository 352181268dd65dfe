"""Rich progress bar for training runs (steps, fps, mean return, ETA; for agent runs sessions, signal share,
reward, sampled tokens/s) and the eval table."""

from __future__ import annotations

import logging
import time
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

log = logging.getLogger("polar.progress")


def cli_console(stderr: bool = True, emoji: bool = True) -> Console:
    """The commands' console: word-wrapped to a terminal's width, and never wrapped when not a terminal (a
    pipe, a log file, CI), where rich would break lines at 80 columns and a path could not be copied."""
    console = Console(stderr=stderr, emoji=emoji)
    console.soft_wrap = not console.is_terminal
    return console


class TrainingProgress:
    """A live bar on a terminal; otherwise (piped, nohup, CI, ``--no-progress``) a log line every ``log_every_s``.

    fps is the last iteration's; ``avg`` is the run's (env steps over training time, across resumes).

    ``total_steps`` (GRPO agent runs) switches to session words: ``env_steps`` counts sessions, and each
    iteration is one step of ``total_steps``, shown with its signal share (groups whose rewards differ),
    reward and sampled tokens per second."""

    def __init__(self, total_env_steps: int, start_steps: int = 0, enabled: bool = True, metric_names: list[str] | None = None,
                 log_every_s: float = 30.0, total_steps: int | None = None) -> None:
        self.console = cli_console()
        self.metric_names = metric_names or ["episode_reward_mean"]
        self.total = total_env_steps
        self.total_steps = total_steps
        self.bar = enabled and self.console.is_terminal
        self.log_every_s = log_every_s
        self._last_log: float | None = None
        rate = ([] if total_steps else [TextColumn("{task.fields[fps]:>7} fps")])
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("sessions" if total_steps else "steps"), *rate, TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, disable=not self.bar, transient=False,
        )
        self.task = self.progress.add_task("train", total=total_env_steps, completed=start_steps, fps="-", info="")

    def __enter__(self) -> TrainingProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, m: dict[str, Any]) -> None:
        if self.total_steps:
            self._update_sessions(m)
            return
        parts = []
        for name in self.metric_names:
            v = m.get(name)
            if v is not None:
                parts.append(f"{name.replace('episode_', '').replace('_mean', '')} {v:.3g}")
        avg = m["env_steps"] / m["time_s"] if m.get("time_s") else m["fps"]
        fps = f"{m['fps']:.0f} (avg {avg:.0f})"
        if self.bar:
            self.progress.update(self.task, completed=m["env_steps"], fps=fps, info="  ".join(parts))
            return
        now = time.monotonic()
        if self._last_log is not None and now - self._last_log < self.log_every_s:
            return
        self._last_log = now
        steps = m["env_steps"]
        eta = f", ETA {_duration((self.total - steps) / avg)}" if avg > 0 and steps < self.total else ""
        log.info("%s/%s env steps (%.0f%%), %.0f fps (avg %.0f)%s%s", f"{steps:,}", f"{self.total:,}",
                 100 * steps / self.total, m["fps"], avg, "".join(f", {p}" for p in parts), eta)


    def _update_sessions(self, m: dict[str, Any]) -> None:
        """An agent run's step in session words: ``step 3/20 done: 144/960 sessions, signal 50%, ...``."""
        parts = []
        share = m.get("groups_signal_share")
        if share is not None:
            parts.append(f"signal {100 * share:.0f}%")
        reward = m.get("reward_mean", m.get("episode_reward_mean"))
        if reward is not None:
            parts.append(f"reward {reward:.3g}")
        tps = m.get("sessions/sampled_tokens_per_s")
        if tps is not None:
            parts.append(f"{tps:.0f} tokens/s")
        for name, label in (("sessions/timeout_rate", "timeouts"), ("sessions/masked_rate", "masked")):
            if m.get(name):
                parts.append(f"{label} {100 * m[name]:.0f}%")
        step = f"step {m.get('iteration', 0)}/{self.total_steps}"
        if self.bar:
            self.progress.update(self.task, completed=m["env_steps"], info=f"{step}  " + "  ".join(parts))
            return
        now = time.monotonic()
        if self._last_log is not None and now - self._last_log < self.log_every_s:
            return
        self._last_log = now
        sessions = m["env_steps"]
        # progress and ETA by steps: dynamic sampling may draw more sessions than the plan (steps x groups)
        done = int(m.get("iteration", 0))
        per_step_s = m["time_s"] / done if m.get("time_s") and done else 0.0
        eta = (f", ETA {_duration((self.total_steps - done) * per_step_s)}"
               if per_step_s > 0 and self.total_steps and done < self.total_steps else "")
        pct = f" ({100 * done / self.total_steps:.0f}%)" if self.total_steps else ""
        count = f"{sessions:,}/{self.total:,}" if self.total and sessions <= self.total else f"{sessions:,}"
        log.info("%s done: %s sessions%s%s%s", step, count, pct, "".join(f", {p}" for p in parts), eta)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def fmt_number(v: Any) -> str:
    """A float for a summary line: 4 significant digits; None as 'n/a'."""
    if v is None:
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_games(result: dict[str, Any], title: str = "evaluation") -> None:
    """A multi-agent evaluation: per-agent returns and win/draw/loss with every agent on its policy, then the
    learner against a random player and against the self-play pool."""
    table = Table(title=title, show_header=True)
    for col in ("games", "agent / opponent", "return mean", "win", "draw", "loss"):
        table.add_column(col, justify="right")
    own = result["per_agent"]
    for agent, ret in own["return_mean"].items():
        r = own.get(agent, {})
        table.add_row(str(own["games"]), agent, fmt_number(ret), *(f"{100 * r.get(k, 0.0):.1f}%"
                                                                  for k in ("win_rate", "draw_rate", "loss_rate")))
    for part in ("vs_random", "vs_pool"):
        if part in result:
            r = result[part]["learner"]
            table.add_row(str(result[part]["games"]), f"learner {part.replace('_', ' ')}", "-",
                          *(f"{100 * r[k]:.1f}%" for k in ("win_rate", "draw_rate", "loss_rate")))
    cli_console(stderr=False).print(table)


def print_eval(result: dict[str, Any], title: str = "evaluation") -> None:
    if "per_agent" in result:  # a multi-agent run (harness.type: pettingzoo)
        print_games(result, title)
        return
    table = Table(title=title, show_header=True)
    for col in ("episodes", "return mean", "return std", "length mean", "success rate"):
        table.add_column(col, justify="right")
    sr = result.get("success_rate")
    table.add_row(str(result["episodes"]), f"{result['return_mean']:.2f}", f"{result['return_std']:.2f}",
                  f"{result['length_mean']:.1f}", "-" if sr is None else f"{100 * sr:.1f}%")
    cli_console(stderr=False).print(table)
