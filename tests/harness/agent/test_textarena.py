"""TextArena's offline board games as Gymnasium ids (polar/harness/textarena_env.py), played by the LLM agent:
they load and play with the network and NLTK's downloader cut off; scripted games end with the right reward
and success; a move TextArena refuses is recorded as an invalid action with its reason while the game goes
on (one retry) or ends (the second in a row loses); a bad game id or option names its key; and a `tiny`-model
`polar run` of examples/llm_textarena.yaml completes."""

import json
import os
import random
import re
import string
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import polar.harness.gymnasium_adapter  # noqa: F401  (registers TextArena/<game>)
from polar.config import load_config
from polar.errors import ConfigError, HarnessError
from polar.harness.llm_env.agent import ActionCodec, InvalidAction
from polar.harness.llm_env.runner import REFUSED_KEY
from polar.harness.sessions import load_run_tasks, session_runner, session_verifier
from polar.harness.textarena_env import GYM_IDS, INVALID_KEY
from polar.inference import ScriptedEngine
from polar.inference.tiny import build_tiny_tokenizer
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.rollout.sessions.session import SessionStatus
from polar.trainers.preflight import check_before_start
from tests.harness.agent.llm_helpers import last_user_turn, scripted

ROOT = Path(__file__).resolve().parents[3]

OFFLINE_SCRIPT = textwrap.dedent("""
    import json, os, socket, sys
    def refuse(*a, **k):
        raise OSError("network access attempted")
    socket.socket.connect = socket.socket.connect_ex = refuse
    socket.create_connection = socket.getaddrinfo = refuse
    import nltk
    nltk.download = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("nltk.download called"))
    import gymnasium as gym
    import polar.harness.gymnasium_adapter
    out = {}
    for gym_id in %r:
        env = gym.make(gym_id)
        obs, info = env.reset(seed=1)
        steps, done = 0, False
        while not done:
            obs, reward, done, _, info = env.step(info["legal_moves"][0])
            assert "polar/invalid_action" not in info, info  # polar's legal moves are the game's
            steps += 1
        out[gym_id] = {"steps": steps, "reward": reward, "outcome": info["outcome"]}
    out["textarena"] = "textarena" in sys.modules
    print(json.dumps(out))
""")


def test_the_games_import_make_and_play_to_the_end_with_no_network_and_no_nltk_download(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "NLTK_DATA": str(tmp_path / "nltk_data"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT % (GYM_IDS,)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("textarena") is True
    assert set(out) == set(GYM_IDS) == {"TextArena/TicTacToe-v0", "TextArena/ConnectFour-v0", "TextArena/Nim-v0"}
    for gym_id, game in out.items():
        assert game["steps"] >= 1 and game["outcome"] in ("win", "loss", "draw"), (gym_id, game)
        assert game["reward"] == {"win": 1.0, "loss": -1.0, "draw": 0.0}[game["outcome"]]
    assert not (tmp_path / "nltk_data").exists()


def test_a_text_action_space_passes_the_move_through_and_refuses_what_it_cannot_hold():
    codec = ActionCodec(gym.spaces.Text(max_length=8, charset=string.printable))
    assert codec.decode("  [col 3] ") == "[col 3]" and codec.decode(4) == "4"
    assert codec.json_schema() == {"type": "string"} and "at most 8 characters" in codec.describe()
    for bad, why in [("", "the move is empty"), ("[4]\x00", "characters this env does not take"),
                     ("[0123456789]", "give 1 to 8 characters"), ([4], "is not a move")]:
        with pytest.raises(InvalidAction, match=why):
            codec.decode(bad)
    with pytest.raises(HarnessError, match=r"agent\.actions names Discrete actions"):
        ActionCodec(gym.spaces.Text(8), ["a"])


def _play(env, moves):
    obs, info = env.reset(seed=0)
    steps = []
    for move in moves:
        steps.append(env.step(move))
        if steps[-1][2]:
            break
    return obs, info, steps


def test_nim_scripted_games_end_with_the_right_reward_and_success():
    _, info, steps = _play(gym.make("TextArena/Nim-v0", piles=[3]), ["[0 3]"])
    obs, reward, terminated, truncated, info = steps[-1]
    assert (reward, terminated, truncated, info["is_success"], info["outcome"]) == (1.0, True, False, True, "win")
    # piles [1, 1]: whatever the LLM takes, the opponent's only legal move takes the last object
    obs, info, steps = _play(gym.make("TextArena/Nim-v0", piles=[1, 1]), ["[0 1]"])
    assert info["legal_moves"] == ["[0 1]", "[1 1]"] and "Welcome to Nim, Player 0" in obs
    obs, reward, terminated, _, info = steps[-1]
    assert (reward, terminated, info["is_success"], info["outcome"]) == (-1.0, True, False, "loss")
    assert "took the last object" in info["reason"]


def test_the_random_opponent_is_seeded_and_plays_legal_moves_from_either_seat():
    def game(seed, player):
        env = gym.make("TextArena/TicTacToe-v0", player=player)
        obs, info = env.reset(seed=seed)
        first, moves = obs, []
        done = False
        while not done:
            obs, reward, done, _, info = env.step(sorted(env.unwrapped.legal_moves())[0])
            moves.append(obs)
        return first, moves, reward, info

    before = random.getstate()
    a, b = game(5, 0), game(5, 0)
    assert a == b  # the same seed plays the same game
    assert random.getstate() == before  # TextArena's State would reseed `random`; polar resets it unseeded
    assert len({json.dumps(game(s, 0)[1]) for s in range(6)}) > 1  # the opponent's moves follow the seed
    first, _, reward, info = game(5, 1)
    assert "You are Player 1" in first and "placed their symbol (O)" in first  # the opponent moved first
    assert info["player"] == 1 and info["is_success"] == (reward > 0)
    assert {gym.make("TextArena/TicTacToe-v0", player="random").reset(seed=s)[1]["player"] for s in range(8)} == {0, 1}


def test_a_refused_move_is_reported_with_its_reason_and_the_second_in_a_row_loses():
    assert INVALID_KEY == REFUSED_KEY  # the env's key is the one the LLM runner reads
    env = gym.make("TextArena/TicTacToe-v0")
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("[4]")
    assert not terminated and INVALID_KEY not in info and "[4]" not in info["legal_moves"]
    obs, reward, terminated, _, info = env.step("[4]")  # occupied: TextArena gives one retry
    assert (reward, terminated) == (0.0, False) and info[INVALID_KEY] == "cell 4 is already occupied."
    assert "attempted an invalid move. Reason: cell 4 is already occupied." in obs
    obs, reward, terminated, _, info = env.step("no brackets")
    assert (reward, terminated, info["outcome"]) == (-1.0, True, "loss")
    assert "does not follow the correct format" in info[INVALID_KEY]


TICTACTOE = """
harness: {type: gymnasium, id: TextArena/TicTacToe-v0, kwargs: {opponent: random, player: 0}}
agent: {type: llm, max_steps: 6, invalid_action_penalty: -0.1, action_format: regex,
        action_regex: '(\\[[^\\[\\]]+\\])', goal: "Win the board game."}
tasks: {source: seeds, start: 0, count: 2}
eval_tasks: {source: seeds, start: 1000, count: 2}
policy: {type: grpo}
"""


def _run(cfg, answer, tmp_path):
    tok = build_tiny_tokenizer()
    engine = ScriptedEngine.tiny(scripted(tok, answer))
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=300, workspace_root=str(tmp_path / "ws"))
    with LocalStack(engine, session_runner(cfg), session_verifier(cfg), settings) as stack:
        groups = stack.run_groups([(t, 1, {}) for t in load_run_tasks(cfg.tasks)], timeout_s=600)
    return [g[0] for g in groups], engine, tok


def test_the_llm_agent_records_refused_moves_as_invalid_actions_and_the_game_decides_the_end(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(TICTACTOE)
    cfg = load_config(path)
    # always the centre: legal once, then refused twice in a row (TextArena's second refusal loses)
    results, engine, tok = _run(cfg, lambda text, i: "I take the centre. [4]", tmp_path)
    for r in results:
        assert r.status == SessionStatus.DONE, r.error
        v = r.verifier_output
        assert v["steps"] == 3 and v["calls"] == 3 and v["parse_failures"] == 0 and v["terminated"]
        assert v["invalid_actions"] == 2 and not v["success"] and v["env_return"] == -1.0
        assert r.reward == pytest.approx(-1.0 - 0.2)
        assert v["invalid_reasons"] == ["step 2: the env refused '[4]': cell 4 is already occupied.",
                                        "step 3: the env refused '[4]': cell 4 is already occupied."]
    prompts = [tok.decode(req.prompt_ids) for req in engine.requests]
    assert "Win the board game." in prompts[0] and "You are Player 0 in Tic Tac Toe" in prompts[0]
    assert "matching the regex (\\[[^\\[\\]]+\\])" in prompts[0]
    third = [last_user_turn(p) for p in prompts if "Step 3." in last_user_turn(p)]  # sessions interleave
    assert len(third) == 2 and all("attempted an invalid move. Reason: cell 4 is already occupied." in t for t in third)


def test_an_answer_with_no_move_is_repaired_and_a_legal_one_plays_the_game_out(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(TICTACTOE.replace("max_steps: 6", "max_steps: 9"))
    cfg = load_config(path)

    def answer(text, i):
        if "not a valid action" in last_user_turn(text):  # the repair: the first move still open
            return "Then " + re.findall(r"Available Moves: '(\[\d\])'", text)[-1]
        return "hmm"

    results, _, _ = _run(cfg, answer, tmp_path)
    for r in results:
        assert r.status == SessionStatus.DONE, r.error
        v = r.verifier_output
        assert v["terminated"] and v["invalid_actions"] == 0 and v["repaired"] == v["steps"] >= 3
        assert v["env_return"] in (1.0, 0.0, -1.0) and v["success"] == (v["env_return"] == 1.0)
        assert r.reward == pytest.approx(v["env_return"])


@pytest.mark.parametrize(("harness", "match"), [
    ({"id": "TextArena/Chess-v0"},
     r"harness\.id: 'TextArena/Chess-v0' is not one of polar's offline TextArena games.*use one of "
     r"TextArena/TicTacToe-v0, TextArena/ConnectFour-v0, TextArena/Nim-v0.*word games are left out"),
    ({"id": "TicTacToe-v0"}, r"harness\.id: unknown Gymnasium id 'TicTacToe-v0' \(did you mean: TextArena/TicTacToe-v0"),
])
def test_a_bad_game_id_is_refused_before_the_run_starts_naming_the_key_and_the_games(tmp_path, harness, match):
    data = yaml.safe_load(TICTACTOE)
    data["harness"] = {"type": "gymnasium", **harness}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=match):
        check_before_start(load_config(path))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"opponent": "minimax"}, r"harness\.kwargs\.opponent: 'minimax' is not an opponent; use random"),
    ({"player": 2}, r"harness\.kwargs\.player: 2 is not a side"),
    ({"pile": [3]}, r"harness\.kwargs\.pile: Nim-v0 has no option 'pile' \(did you mean: piles"),
])
def test_a_bad_option_names_its_key(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        gym.make("TextArena/Nim-v0", **kwargs)


def test_polar_run_trains_the_llm_agent_on_tictactoe_with_the_tiny_model(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / "llm_textarena.yaml").read_text())
    cfg["model"] = {"name_or_path": "tiny"}
    cfg["agent"].update(max_steps=3, max_tokens=8, invalid_action_penalty=-0.1)
    cfg["tasks"] = {"source": "seeds", "start": 0, "count": 2}
    cfg["eval_tasks"] = {"source": "seeds", "start": 100000, "count": 2}
    # one round a step (no dynamic sampling): the session count below is the plan's
    cfg["policy"]["kwargs"].update(group_size=2, tasks_per_step=2, total_steps=1, lora=None,
                                   dynamic_sampling={"max_extra_rounds": 0})
    cfg["logging"]["checkpoint_freq"] = 1
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(path), "--run-dir", str(run),
                           "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward_mean" in r] == [1]
    sessions = [json.loads(line) for line in (run / "sessions" / "index.jsonl").read_text().splitlines()]
    train = [s for s in sessions if "rollout_step" in s.get("metadata", {})]
    assert len(train) == 2 * 2 and all(s["status"] in ("done", "timeout") for s in train), sessions[:2]
    for s in train:
        v = s["verifier_output"]
        assert 1 <= v["steps"] <= 3 and 0 <= v["invalid_actions"] <= v["steps"] and v["env_return"] in (-1.0, 0.0, 1.0)
        assert s["reward"] == pytest.approx(v["env_return"] - 0.1 * v["invalid_actions"])
    assert (run / "eval" / "before_grpo.json").exists() and (run / "eval" / "after_grpo.json").exists()
