"""Credentials never reach a run folder: a connector token, an API key in a connector's or an agent's ``env:``
and the gateway's admin token, given through the environment, are in no file a run, ``polar eval --record``,
``polar export``, an eval suite's report, ``polar resume`` or a checkpoint writes (binary files included).

Real ``polar`` subprocesses: a short key-door PPO run through its connector, its recorded episodes and an eval
suite report written inside the run folder, and a one-step GRPO run of a command agent on the tiny model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# split: the literals never sit whole in this file's bytes, so a grep of the repository finds none either
TOKEN = "tok-" + "never-on-disk-51c2e0"
API_KEY = "key-" + "never-on-disk-8b7d44"
ADMIN = "adm-" + "never-on-disk-0f9e13"


def polar(*args: str | Path, cwd: Path, env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def files_holding_a_secret(folder: Path) -> list[str]:
    hits = []
    for f in sorted(folder.rglob("*")):
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            hits += [f"{f.relative_to(folder)}: {name}" for name, s in (("token", TOKEN), ("api key", API_KEY),
                                                                         ("admin token", ADMIN)) if s.encode() in data]
    return hits


def test_connector_token_and_env_keys_never_reach_recordings_reports_or_checkpoints(tmp_path):
    """The attack: read a credential from someone's run folder (served by the dashboard, copied, uploaded).
    ``polar eval --record`` used to write the harness config, token included, into ``episodes/*/index.json``;
    an eval suite's ``report.json`` the harness of each row."""
    src = ROOT / "examples" / "keydoor"
    game = tmp_path / "game"
    game.mkdir()
    for f in ("keydoor_game.py", "my_game_connector.py", "polar_agent_definition.py"):
        shutil.copy(src / f, game / f)
    cfg = yaml.safe_load((src / "demo.yaml").read_text())
    cfg["harness"]["connector_spec"]["env"] = {"GAME_API_KEY": API_KEY}
    cfg["total_env_steps"] = 512
    cfg["distribution"]["envs_per_worker"] = 4
    cfg["logging"] = {"checkpoint_freq": 1, "tensorboard": True, "progress_bar": False}
    cfg["eval"] = {"at_end": False}
    (game / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {"POLAR_CONNECTOR_TOKEN": TOKEN, "GAME_API_KEY": API_KEY}
    run = tmp_path / "run"
    res = polar("run", "--config", game / "c.yaml", "--run-dir", run, "--no-progress", cwd=game, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list((run / "checkpoints").glob("ckpt_*.pt")), "the run wrote no checkpoint to search"

    rec = polar("eval", run, "--record", "1", "--trust-code", cwd=game, env=env)
    assert rec.returncode == 0, rec.stderr[-3000:]
    [index] = list((run / "episodes").glob("*/index.json"))
    assert files_holding_a_secret(index.parent) == []
    assert "<redacted>" in index.read_text()  # the harness is there, its secrets are not

    exp = polar("export", run, "--out", run / "export", "--samples", "4", "--trust-code", cwd=game, env=env)
    assert exp.returncode == 0, exp.stderr[-3000:]

    suite = {"name": "s", "out_dir": str(run / "eval-suite"),
             "policies": [{"name": "p", "run": str(run)}],
             "harnesses": [{"name": "keydoor", "seeds": {"start": 10**6, "count": 2}, "max_episode_steps": 50,
                            "harness": {**cfg["harness"], "connector_spec": {**cfg["harness"]["connector_spec"],
                                                                             "token": TOKEN}}}]}
    (game / "suite.yaml").write_text(yaml.safe_dump(suite))
    rep = polar("eval", "--suite", game / "suite.yaml", "--trust-code", cwd=game, env=env)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-3000:]
    assert (run / "eval-suite" / "report.json").is_file()
    (game / "suite.yaml").unlink()  # the suite file is the user's own; it is not in the run folder anyway

    # a resume given the token as an override (shown in ps: the docs say not to) still writes it nowhere
    more = polar("resume", run, "-o", "total_env_steps=1024", "-o", f"harness.connector_spec.token={TOKEN}",
                 "--no-progress", cwd=game, env=env)
    assert more.returncode == 0, more.stderr[-3000:]
    assert "harness.connector_spec.token=<redacted>" in more.stderr, more.stderr[-3000:]

    assert files_holding_a_secret(run) == []
    for out in (res, rec, exp, rep, more):
        assert TOKEN not in out.stdout + out.stderr and API_KEY not in out.stdout + out.stderr


def test_agent_env_keys_and_admin_token_never_reach_an_agent_run_folder(tmp_path):
    """A command agent given an API key in ``harness.env`` and a gateway admin token from
    ``$POLAR_GATEWAY_ADMIN_TOKEN``: one GRPO step on the tiny model, a checkpoint, TensorBoard; no file of the
    run folder (gateway records, sessions, workspaces, checkpoints) holds either."""
    src = ROOT / "examples" / "agentic"
    work = tmp_path / "agentic"
    work.mkdir()
    for f in ("calculator_agent.py", "verifier.py"):
        shutil.copy(src / f, work / f)
    (work / "train.jsonl").write_text("".join((src / "train.jsonl").read_text().splitlines(keepends=True)[:2]))
    cfg = yaml.safe_load((src / "calculator_command.yaml").read_text())
    cfg.pop("sft_warmup")
    cfg.pop("eval_tasks")
    cfg["harness"]["env"] = {"SEARCH_API_KEY": API_KEY}
    cfg["policy"]["kwargs"].update(group_size=2, tasks_per_step=2, total_steps=1,
                                   micro_batch_size=4)
    cfg["logging"] = {"checkpoint_freq": 1, "tensorboard": True}
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {"POLAR_GATEWAY_ADMIN_TOKEN": ADMIN}
    res = polar("run", "--config", work / "c.yaml", "--run-dir", run, "--no-progress", cwd=work, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run / "gateway").is_dir() and list((run / "checkpoints").glob("ckpt_*")), sorted(run.iterdir())
    assert files_holding_a_secret(run) == []
    assert API_KEY not in res.stdout + res.stderr and ADMIN not in res.stdout + res.stderr
