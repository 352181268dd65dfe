"""TextArena's offline board games (``textarena==0.7.4``) as Gymnasium envs the built-in LLM agent plays.

``harness: {type: gymnasium, id: TextArena/TicTacToe-v0, kwargs: {opponent: random, player: 0}}``

Why Gymnasium ids and not a new ``harness.type``: ``type: gymnasium`` already means "any registered id, no
code", and everything that drives an env harness — ``polar run``'s preflight (``check_id``), ``make_env``,
``polar check`` and the LLM agent's runner — takes any Gymnasium env. Registering each game under the
``TextArena/`` namespace (``register_textarena_envs``, called when ``polar.harness.gymnasium_adapter`` is
imported) adds no config section, no run-kind rule and no runner; an unknown game is refused at load by the
same id check as any Gymnasium id, with the list of games here. The two things a TextArena game has that the
toy-text envs lack map onto existing parts: moves are text (a ``Text`` action space, which the agent's
``ActionCodec`` passes through as the answer's move string) and the game itself refuses illegal moves
(``info["polar/invalid_action"]`` carries TextArena's reason; the runner records it as an invalid action,
and the game goes on or ends as TextArena's rules say: one retry, then the second invalid move loses).

Only games that run fully offline are registered: TicTacToe, ConnectFour and Nim. Their modules import
nothing but ``re`` and ``textarena``; TextArena's word games are left out because they call
``nltk.download`` when made. ``import textarena`` itself imports ``nltk``, ``requests`` and ``websockets``
(for its online play) but opens no connection and downloads nothing.

The LLM plays one side (``player``: 0, 1, or ``random``: drawn from the reset seed); the other side is the
``opponent``: ``random`` plays a uniformly random legal move drawn from the env's seeded ``np_random``. The
observation is TextArena's own text, the messages the LLM's side received since its last move (the game's
prompt first), each line ``[GAME] ...`` or ``[Player 1] ...`` as TextArena's ``LLMObservationWrapper`` writes
them; ``observation: full`` repeats the whole game each turn instead (for ``agent.history_turns: 0``). The
reward is 0 until the game ends, then TextArena's reward for the LLM's side (1 win, 0 draw, -1 loss);
``info["is_success"]`` is a win.

TextArena's ``State`` seeds the process-wide ``random`` module when given a seed; these games draw nothing
from it, so the game is reset with ``seed=None`` and all randomness (side, opponent) comes from ``np_random``.
"""

from __future__ import annotations

import importlib
import inspect
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from polar.config.base import did_you_mean
from polar.errors import ConfigError

NAMESPACE = "TextArena"
ENTRY_POINT = "polar.harness.textarena_env:TextArenaEnv"
INVALID_KEY = "polar/invalid_action"  # info key: the game refused the move, and why
_CHARSET = string.printable
_OWN_KWARGS = ("opponent", "player", "observation")


def _tictactoe_moves(game: Any) -> list[str]:
    board = game.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connectfour_moves(game: Any) -> list[str]:
    board = game.state.game_state["board"]
    return [f"[col {c}]" for c in range(len(board[0])) if board[0][c] == "."]


def _nim_moves(game: Any) -> list[str]:
    piles = game.state.game_state["piles"]
    return [f"[{p} {q}]" for p, n in enumerate(piles) for q in range(1, n + 1)]


@dataclass(frozen=True)
class Game:
    """One offline TextArena game: its TextArena id and its legal moves (as TextArena's action strings)."""

    textarena_id: str
    legal_moves: Callable[[Any], list[str]]  # (the TextArena env) -> moves the side to play may make


GAMES: dict[str, Game] = {
    "TicTacToe-v0": Game("TicTacToe-v0", _tictactoe_moves),
    "ConnectFour-v0": Game("ConnectFour-v0", _connectfour_moves),
    "Nim-v0": Game("Nim-v0", _nim_moves),
}
GYM_IDS = tuple(f"{NAMESPACE}/{name}" for name in GAMES)


def register_textarena_envs() -> None:
    """Register ``TextArena/<game>`` for each game in ``GAMES`` (idempotent; imports nothing of TextArena)."""
    for name in GAMES:
        gym_id = f"{NAMESPACE}/{name}"
        if gym_id not in gym.registry:
            gym.register(gym_id, entry_point=ENTRY_POINT, kwargs={"game": name})


def unknown_game(env_id: str) -> str:
    """The error for a ``TextArena/...`` id that is not one of the offline games."""
    return (f"harness.id: {env_id!r} is not one of polar's offline TextArena games"
            f"{did_you_mean(env_id, list(GYM_IDS))}; use one of {', '.join(GYM_IDS)} (a game's own options, "
            "e.g. piles for Nim or num_rows for ConnectFour, go in harness.kwargs). TextArena's word games are "
            "left out: they download NLTK data.")


def _import_textarena() -> Any:
    try:
        import textarena
    except ImportError as e:
        raise ConfigError(f"harness.id {NAMESPACE}/...: TextArena is not installed ({e}); "
                          "pip install 'polar-rl[textarena]' (textarena==0.7.4)") from None
    return textarena


def _format(messages: list[tuple[int, str, Any]], role_mapping: dict[int, str]) -> str:
    """Messages as TextArena's ``LLMObservationWrapper`` writes them: one ``[SENDER] message`` line each."""
    game_id = -1
    return "\n".join(f"[{'GAME' if sender == game_id else role_mapping.get(sender, f'Player {sender}')}] {message}"
                     for sender, message, _ in messages)


class TextArenaEnv(gym.Env):
    """A two-player TextArena game from one side's seat: ``step(move)`` plays the LLM's move, then the opponent's."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, game: str, opponent: str = "random", player: int | str = 0, observation: str = "new",
                 render_mode: str | None = None, **game_kwargs: Any) -> None:
        if game not in GAMES:
            raise ConfigError(unknown_game(f"{NAMESPACE}/{game}"))
        if opponent != "random":
            raise ConfigError(f"harness.kwargs.opponent: {opponent!r} is not an opponent; use random (a uniformly "
                              "random legal move, seeded by the episode's seed)")
        if player not in (0, 1, "random"):
            raise ConfigError(f"harness.kwargs.player: {player!r} is not a side; use 0 (moves first), 1 or random "
                              "(drawn from each episode's seed)")
        if observation not in ("new", "full"):
            raise ConfigError(f"harness.kwargs.observation: {observation!r}; use new (the messages since the last "
                              "move) or full (the whole game every turn)")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"harness.kwargs.render_mode: {render_mode!r}; {NAMESPACE} games render ansi only")
        self.game, self.spec_game = game, GAMES[game]
        self.opponent, self.player, self.observation_mode, self.render_mode = opponent, player, observation, render_mode
        ta = _import_textarena()
        spec = ta.envs.registration.ENV_REGISTRY[f"{self.spec_game.textarena_id}-raw"]
        module, _, cls_name = spec.entry_point.partition(":")
        options = [p for p in inspect.signature(getattr(importlib.import_module(module), cls_name)).parameters]
        unknown = sorted(set(game_kwargs) - set(options))
        if unknown:
            allowed = ", ".join([*options, *_OWN_KWARGS]) or ", ".join(_OWN_KWARGS)
            raise ConfigError(f"harness.kwargs.{unknown[0]}: {game} has no option {unknown[0]!r}"
                              f"{did_you_mean(unknown[0], [*options, *_OWN_KWARGS])}; its options are {allowed}")
        self._ta, self.game_kwargs = ta, game_kwargs
        self.action_space = spaces.Text(max_length=256, min_length=1, charset=_CHARSET)
        self.observation_space = spaces.Text(max_length=1_000_000, min_length=0, charset=_CHARSET)
        self.ta_env: Any = None
        self.side = 0
        self._refused: list[str] = []
        self._history: list[str] = []

    # ---- the game ----------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.ta_env = self._ta.make(f"{self.spec_game.textarena_id}-raw", **self.game_kwargs)
        self.ta_env.reset(num_players=2, seed=None)  # a seed would reseed the process-wide `random` (see above)
        state = self.ta_env.state
        refuse = state.set_invalid_move

        def record(reason: str, *args: Any, **kwargs: Any) -> Any:  # TextArena's own verdict, kept with its reason
            self._refused.append(str(reason))
            return refuse(reason, *args, **kwargs)

        state.set_invalid_move = record
        self.side = int(self.np_random.integers(2)) if self.player == "random" else int(self.player)
        self._history = []
        done = self._opponent_moves()
        return self._observe(), {"player": self.side, "legal_moves": [] if done else self.legal_moves()}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.ta_env is None:
            raise RuntimeError("call reset() before step()")
        if self.ta_env.state.done:
            raise RuntimeError("the game is over; call reset()")
        self._refused.clear()
        done, _ = self.ta_env.step(action=str(action))
        info: dict[str, Any] = {"player": self.side}
        if self._refused:
            info[INVALID_KEY] = self._refused[-1]
            self._refused.clear()
        if not done:
            done = self._opponent_moves()
        obs = self._observe()
        reward = 0.0
        if done:
            rewards, game_info = self.ta_env.close()
            reward = float((rewards or {}).get(self.side, 0.0))
            reason = game_info.get(self.side, {}).get("reason")
            info.update(is_success=reward > 0, outcome="win" if reward > 0 else "loss" if reward < 0 else "draw",
                        reason=reason)
        else:
            info["legal_moves"] = self.legal_moves()
        return obs, reward, bool(done), False, info

    def legal_moves(self) -> list[str]:
        """The moves the side to play may make now, as TextArena's action strings."""
        return self.spec_game.legal_moves(self.ta_env)

    def _opponent_moves(self) -> bool:
        """The opponent plays until it is the LLM's turn or the game is over; whether it is over."""
        state = self.ta_env.state
        for _ in range(100):  # one move per turn in these games; the bound only guards a game's bug
            if state.done or state.current_player_id == self.side:
                return bool(state.done)
            moves = self.legal_moves()
            state.observations[state.current_player_id] = []  # the opponent reads nothing: drop its queue
            move = moves[int(self.np_random.integers(len(moves)))]
            self._refused.clear()
            self.ta_env.step(action=move)
            if self._refused:  # a legal move refused: polar's legal_moves disagrees with the game's rules
                raise RuntimeError(f"{self.game}: TextArena refused the opponent's legal move {move!r}: "
                                   f"{self._refused[-1]}")
        raise RuntimeError(f"{self.game}: the opponent did not finish its turn in 100 moves")

    def _observe(self) -> str:
        state = self.ta_env.state
        new, state.observations[self.side] = state.observations[self.side], []
        text = _format(new, state.role_mapping)
        if self.observation_mode == "full":
            self._history.append(text)
            return "\n".join(t for t in self._history if t)
        return text

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.ta_env is None:
            return None
        return str(self.ta_env.get_board_str())
