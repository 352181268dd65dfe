"""One connector process seen from polar: start it, talk to it, watch it, restart it.

polar listens (a Unix socket in a private temp dir, or TCP on 127.0.0.1) and the connector dials
back, so readiness is simply "it connected and said hello" and no port is ever guessed. Its stdout
and stderr are drained by a thread into a ring buffer: printing never blocks or corrupts the channel,
and the last lines are quoted when the process keeps dying.
"""

from __future__ import annotations

import atexit
import collections
import logging
import numbers
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces as gym_spaces
from gymnasium.vector.utils import batch_space

from polar.errors import (
    ConnectorCrashed,
    ConnectorRemoteError,
    ConnectorStartError,
    ConnectorTimeout,
    EnvContractError,
    ProtocolError,
)
from polar.harness.connector import shm, supervisor
from polar.harness.connector.shm import SharedReply, SharedSteps
from polar.harness.connector.spaces import space_from_wire, wire_space_bytes
from polar.harness.connector.wire import NOT_POLAR, PROTOCOL_VERSIONS, Codec, ConnectionClosed, FrameSocket
from polar.lifetime import popen_tied

if TYPE_CHECKING:
    from polar.config.harness import ConnectorSpec

SUPERVISOR = supervisor.__file__  # run as a script, isolated (-I -S): see its module

log = logging.getLogger("polar.connector")
_POLAR_ROOT = str(Path(__file__).resolve().parents[3])
# A restarted process that served this many env steps (steps x the copies it hosts) has recovered, and
# its earlier failures stop counting as "in a row". Counted in env steps, not process steps: a game that
# crashes once every few hundred steps per copy crashes K times as often in a process hosting K copies.
# Small on purpose: with fresh seeds per restart, a crash that rare gives up with a probability of about
# (1 - exp(-10 / few hundred)) ** (max_restarts + 1), i.e. never, however long the run.
HEALTHY_ENV_STEPS = 10
# how long an error message waits for a dead process's output still in the pipe (bounded: a grandchild that
# escaped the process group may hold the pipe open)
OUTPUT_DRAIN_S = 2.0
KILL_WAIT_S = 5.0  # how long the supervisor gets to kill and reap a connector's tree before its group is SIGKILLed
PID_WAIT_S = 5.0  # how long `pid` waits for the supervisor to report the connector's pid
UNIX_PATH_MAX_BYTES = 107  # sun_path holds 108 bytes with the trailing NUL
SEED_KEY = "seed"
REPLY_KEYS = {"init": ("action_space",), "reset": ("obs",), "step": ("obs", "rewards", "terminated", "truncated")}
MULTI_AGENT_INIT_KEYS = ("possible_agents", "action_spaces", "observation_spaces")  # protocol 2's init reply


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def kill_leftovers() -> None:
    """A hung connector never sees its socket close: make sure none outlives polar (at exit, and from a
    rollout worker whose learner is gone)."""
    for proc in list(_LIVE):
        proc.kill()
        if proc._tmpdir:
            shutil.rmtree(proc._tmpdir, ignore_errors=True)


def expand_command(command: list[str], config_dir: Path) -> list[str]:
    """A ``command:`` connector's argv with ``{python}`` (the interpreter running polar, ``sys.executable``) and
    ``{config_dir}`` filled in, as in agent harness commands. Only these two: other braces stay as written."""
    values = {"{python}": sys.executable, "{config_dir}": str(config_dir)}
    out = []
    for part in command:
        for key, value in values.items():
            part = part.replace(key, value)
        out.append(part)
    return out


def check_command(spec: ConnectorSpec, config_dir: Path) -> None:
    """A command connector's program exists (on PATH, with ``spec.env``'s PATH, or next to the config), or one
    ``ConnectorStartError``. ``polar run`` calls it before it creates anything."""
    if not spec.command:  # a Python connector (module + class_name): nothing to look for
        return
    program = expand_command(spec.command, config_dir)[0]
    path = {**os.environ, **{k: str(v) for k, v in spec.env.items()}}.get("PATH")
    if shutil.which(program, path=path) is None and not Path(config_dir, program).exists():
        raise ConnectorStartError(f"connector_spec.command: executable {program!r} not found on PATH; install it or "
                                  "fix the command")


class ProcessFailed(Exception):
    """Internal: the process died or hung; the caller restarts it."""


def derive_seed(*parts: int) -> int:
    """A seed in [0, 2**32) mixed from ``parts`` by numpy's ``SeedSequence`` (each part taken mod 2**64).

    Used for the per-copy ``config["seed"]`` and for the reset seeds after a restart; the rule is
    documented in docs/connector-protocol.md ("Copies and seeds") so a user can recompute any copy's seed.
    """
    return int(np.random.SeedSequence([int(x) % 2**64 for x in parts]).generate_state(1)[0])


def copy_seed(config_seed: int, run_seed: int | None, worker_index: int, vector_index: int, restarts: int) -> int:
    """The ``config["seed"]`` copy ``vector_index`` of rollout worker ``worker_index`` gets after ``restarts`` restarts."""
    return derive_seed(config_seed, 0 if run_seed is None else run_seed, worker_index, vector_index, restarts)


def command_label(command: list[str]) -> str:
    """How a ``command:`` connector is named until it says its class name: its command line, shortened."""
    text = shlex.join(command)
    return text if len(text) <= 60 else text[:57] + "..."


def declared_name(name: str) -> str:
    """A name the connector gave itself, fit for one-line messages and terminals: printable, at most 80 characters
    (it is the connector's own text: a newline or an escape sequence in it must not forge log lines)."""
    text = "".join(c if c.isprintable() else "?" for c in name)
    return text if len(text) <= 80 else text[:77] + "..."


class ConnectorProcess:
    """A connector process hosting ``num_envs`` copies, with restart-on-failure bookkeeping."""

    def __init__(self, spec: ConnectorSpec, num_envs: int, config_dir: Path | None = None, index: int = 0, *,
                 worker_index: int = 0, vector_offset: int = 0, seed: int | None = None) -> None:
        self.spec = spec
        self.index = index
        label = f"connector-{index}"
        self.num_envs = num_envs
        self.config_dir = Path(config_dir) if config_dir else Path.cwd()
        self.label = label
        # until the connector names itself (hello ``name``, then init's ``class_name``)
        self.name = spec.class_name or (command_label(spec.command) if spec.command else "connector")
        self.worker_index = worker_index  # which rollout worker hosts this process (0: the learner / a check)
        self.vector_offset = vector_offset  # vector index of this process's first copy
        self.run_seed = seed
        self._warned_seed = False
        self.codec = Codec()
        self._obs_bytes: int | None = None  # one declared observation, once the spaces are known
        self.set_observation_bytes(None)
        self.restarts = 0
        self.consecutive_failures = 0
        self.steps_since_start = 0
        self.describe: dict = {}
        self.protocol = 0  # the version the connector's hello says, once connected
        self._op: str | None = None
        self.dead_reason: str | None = None
        self.last_io = time.monotonic()
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self._drain_thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None  # the supervisor; the connector is its only child
        self._pid_pipe: int | None = None  # where the supervisor writes the connector's pid
        self._child_pid: int | None = None
        self._conn: FrameSocket | None = None
        self._tmpdir: str | None = None
        self._shared: SharedSteps | None = None  # shared-memory steps (shm.py), when both sides offer them
        self._seq = 0  # requests sent through the mapping's counter
        self._listener = self._listen()
        _LIVE.add(self)

    # ------------------------------------------------------------------------------- lifecycle
    def _listen(self) -> socket.socket:
        spec = self.spec
        if spec.transport == "unix":
            self._tmpdir = tempfile.mkdtemp(prefix="polar-conn-")
            path = os.path.join(self._tmpdir, "c.sock")
            if len(os.fsencode(path)) > UNIX_PATH_MAX_BYTES:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                raise ConnectorStartError(
                    f"{self.name}: the connector socket {path} is {len(os.fsencode(path))} bytes, over the "
                    f"{UNIX_PATH_MAX_BYTES}-byte AF_UNIX limit (the temp folder is {tempfile.gettempdir()}); set "
                    "TMPDIR to a short writable folder, or connector_spec.transport: tcp")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            self.address = f"unix:{path}"
        else:
            family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((spec.host, spec.port + self.index if spec.port else 0))  # a fixed port: one per process
            host = "127.0.0.1" if spec.host in ("0.0.0.0", "::") else spec.host  # our own child dials loopback
            self.address = f"tcp:{host}:{sock.getsockname()[1]}"
        sock.listen(4)
        # A token always guards the hello; a non-loopback bind requires the user's own (checked in config).
        self.token = spec.token or secrets.token_hex(16)
        return sock

    def command(self) -> list[str]:
        spec = self.spec
        if spec.command:
            cmd = expand_command(spec.command, self.config_dir)
            path = {**os.environ, **{k: str(v) for k, v in spec.env.items()}}.get("PATH")
            beside = Path(self.config_dir, cmd[0])
            if os.sep not in cmd[0] and shutil.which(cmd[0], path=path) is None and beside.exists():
                cmd[0] = str(beside)  # next to the config, as check_command accepts it (exec alone searches PATH)
            return cmd
        if not (spec.module and spec.class_name):  # the config's validator requires one or the other
            raise ConnectorStartError("connector_spec needs module + class_name (a Python connector) or command (any "
                                      "other language)")
        cmd = [spec.python or sys.executable, "-m", "polar.harness.connector.server"]
        cmd += ["--module", spec.module, "--class-name", spec.class_name]
        for p in dict.fromkeys([str(self.config_dir), os.getcwd()]):
            cmd += ["--search-path", p]
        return cmd

    def spawn(self) -> None:
        """Start the process (no waiting): pair with ``connect()``."""
        env = dict(os.environ)
        env.update({k: str(v) for k, v in self.spec.env.items()})
        env.update(POLAR_CONNECTOR_ADDRESS=self.address, POLAR_CONNECTOR_TOKEN=self.token, PYTHONUNBUFFERED="1")
        env.setdefault("SDL_VIDEODRIVER", "dummy")
        # system metrics name the process by it (polar.metrics.system); the supervisor has a role of its own
        env[supervisor.ROLE_VARIABLE] = env.get("POLAR_ROLE", "connector")
        env["POLAR_ROLE"] = supervisor.ROLE
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_POLAR_ROOT, env.get("PYTHONPATH")) if p)
        cmd = self.command()
        cwd = str(self.config_dir) if self.spec.command else None
        if self.spec.command:
            check_command(self.spec, self.config_dir)
        self._tail.clear()
        # Under the supervisor (see its module): the connector's whole tree, new sessions and daemons included,
        # dies when polar stops it and when polar dies, even SIGKILLed (SIGTERM as the supervisor's
        # parent-death signal, armed from polar.lifetime's long-lived spawner thread).
        self._close_pid_pipe()
        pid_read, pid_write = os.pipe()
        try:
            self._proc = popen_tied(
                [sys.executable, "-I", "-S", SUPERVISOR, str(pid_write), str(os.getpid()), "--", *cmd],
                pdeathsig=signal.SIGTERM, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(pid_write,),
            )
        except BaseException:
            os.close(pid_read)
            raise
        finally:
            os.close(pid_write)
        self._pid_pipe = pid_read
        self._child_pid = None
        self._op = None  # a new process: nothing asked of it yet
        self._drain_thread = threading.Thread(target=self._drain, args=(self._proc,), daemon=True,
                                              name=f"polar-{self.label}-out")
        self._drain_thread.start()
        self.dead_reason = None
        self.steps_since_start = 0

    def set_observation_bytes(self, obs_bytes: int | None) -> None:
        """Bound what one reply's compressed arrays may decode to: what a frame can carry uncompressed
        (``max_frame_bytes``) plus each copy's observation and final observation as declared (``obs_bytes``,
        unknown until the spaces are). A reply over it is refused before it is decoded."""
        self._obs_bytes = obs_bytes
        cap = self.spec.max_frame_bytes
        why = f"max_frame_bytes={cap}"
        if obs_bytes is not None:
            cap += 2 * self.num_envs * obs_bytes
            why += f" + 2 x {self.num_envs} copies x {obs_bytes} bytes per declared observation"
        self.codec.max_decoded_bytes = cap
        self.codec.decode_limit_why = f"{why}; raise connector_spec.max_frame_bytes if such replies are intended"

    def _budget_init_reply(self, data: bytes) -> None:
        """Bound the init reply by the spaces it declares (each may carry two arrays of its size: Box low, high),
        read from the reply's plain fields before any of its arrays is decoded."""
        skim = self.codec.skim(data)
        if isinstance(skim, dict):
            if isinstance(skim.get("class_name"), str) and skim["class_name"]:
                self.name = declared_name(skim["class_name"])  # so an error decoding this reply names the class
            declared = sum(wire_space_bytes(skim.get(k)) for k in ("observation_space", "action_space"))
            cap = self.spec.max_frame_bytes + 2 * declared
            self.codec.max_decoded_bytes = cap
            self.codec.decode_limit_why = (f"max_frame_bytes={self.spec.max_frame_bytes} + 2 x {declared} bytes of "
                                           "declared spaces (their low and high arrays); raise "
                                           "connector_spec.max_frame_bytes if such replies are intended")

    def mark_healthy_step(self) -> None:
        """Count a good step; after HEALTHY_ENV_STEPS in one incarnation, past failures stop counting."""
        self.steps_since_start += self.num_envs
        if self.steps_since_start >= HEALTHY_ENV_STEPS:
            self.consecutive_failures = 0

    def copies(self) -> list[dict]:
        """What each copy is told in ``init``: where it runs and, when the config has a seed, its own seed.

        Like RLlib's ``EnvContext``: copy ``i`` of this process is vector index ``vector_offset + i`` of
        rollout worker ``worker_index``. A restarted process's copies get seeds they never had, so a game
        whose crash is determined by its seed does not crash at the same step again.
        """
        config_seed = self.spec.config.get(SEED_KEY)
        int_seed = (int(config_seed) if isinstance(config_seed, numbers.Integral) and not isinstance(config_seed, bool)
                    else None)
        seeded = int_seed is not None
        if SEED_KEY in self.spec.config and config_seed is not None and not seeded and not self._warned_seed:
            self._warned_seed = True
            log.warning("%s: connector_spec.config.seed is %r, not an integer: every copy gets it unchanged and may "
                        "play identical episodes; give an integer to get one seed per copy", self.name, config_seed)
        out = []
        for i in range(self.num_envs):
            v = self.vector_offset + i
            entry = {"worker_index": self.worker_index, "vector_index": v, "restarts": self.restarts}
            if int_seed is not None:
                entry[SEED_KEY] = copy_seed(int_seed, self.run_seed, self.worker_index, v, self.restarts)
            out.append(entry)
        return out

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        stdout = proc.stdout
        assert stdout is not None  # spawned with stdout=PIPE
        for raw in iter(stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self._tail.append(line)
            log.debug("[%s pid %d] %s", self.label, proc.pid, line)
        stdout.close()

    def connect(self) -> dict:
        """Wait for the spawned process to dial back, check its hello, send init; return its description."""
        proc = self._proc
        if proc is None:
            raise ProcessFailed("connect() before the process was started")
        deadline = time.monotonic() + self.spec.start_timeout_s
        self._listener.settimeout(0.05)
        while True:
            try:
                sock, _ = self._listener.accept()
                break
            except TimeoutError:
                if proc.poll() is not None:
                    raise ProcessFailed(f"the process exited with code {proc.returncode} before connecting") from None
                if time.monotonic() > deadline:
                    raise ProcessFailed(f"the process did not connect within start_timeout_s={self.spec.start_timeout_s}") from None
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = FrameSocket(sock, self.spec.max_frame_bytes)
        hello = self._recv(self.spec.start_timeout_s)
        if not isinstance(hello, dict) or hello.get("type") != "hello":
            raise ConnectorStartError(f"{self.name} {NOT_POLAR}: its first frame must be a hello map "
                                      f"({{'type': 'hello', ...}}), got {hello!r:.200}")
        if not secrets.compare_digest(str(hello.get("token", "")), self.token):
            sock.close()
            raise ConnectorStartError(f"{self.name}: a connector connected with a wrong token; check connector_spec.token")
        if isinstance(hello.get("name"), str) and hello["name"]:
            self.name = declared_name(hello["name"])  # optional in the hello: lets errors before init name the connector
        if hello.get("protocol") not in PROTOCOL_VERSIONS:
            raise ConnectorStartError(f"{self.name}: speaks protocol {hello.get('protocol')!r}; polar speaks "
                                      f"{' and '.join(map(str, PROTOCOL_VERSIONS))}")
        self.protocol = int(hello["protocol"])
        options = {
            "compression": self.spec.compression,
            "compress_min_bytes": self.spec.compress_min_bytes,
            "max_frame_bytes": self.spec.max_frame_bytes,
        }
        self.describe = self.call({"op": "init", "config": self.spec.config, "num_envs": self.num_envs, "copies": self.copies(),
                                   "options": options}, self.spec.start_timeout_s)
        self.set_observation_bytes(self._obs_bytes)  # the init reply had its own bound; a restart keeps the spaces
        if isinstance(self.describe.get("class_name"), str) and self.describe["class_name"]:
            self.name = declared_name(self.describe["class_name"])  # errors name the class the connector declared, not its launcher
        if self.spec.shared_memory and hello.get("shared_memory") == shm.SHM_VERSION and shm.supported():
            self._share_memory()
        return self.describe

    @property
    def shared_memory(self) -> bool:
        """Whether steps travel through shared memory (docs/connector-protocol.md, section 4.7)."""
        return self._shared is not None

    def _share_memory(self) -> None:
        """Offer the connector a mapping for step arrays; a connector that cannot map it keeps the socket path."""
        desc = self.describe
        if desc.get("multi_agent") or desc.get("observation_space") is None:
            return
        try:
            act_space = space_from_wire(desc["action_space"])
            obs_space = space_from_wire(desc["observation_space"])
        except EnvContractError:
            return  # the vector env reports it
        if isinstance(act_space, gym_spaces.Dict) or isinstance(obs_space, gym_spaces.Dict):
            return
        act, obs = batch_space(act_space, self.num_envs), batch_space(obs_space, self.num_envs)
        assert act.shape is not None and obs.shape is not None and act.dtype is not None and obs.dtype is not None
        shared, path = SharedSteps.create(self.num_envs, (act.shape, act.dtype), (obs.shape, obs.dtype))
        try:
            self.call({"op": "shared_memory", "version": shm.SHM_VERSION, "path": path, "size": shared.size,
                       "slots": dict(shm.SLOTS), "fields": {k: f.to_wire() for k, f in shared.fields.items()}})
        except (ConnectorRemoteError, EnvContractError, ProtocolError) as e:
            log.debug("%s: no shared-memory steps: %s", self.name, e)
            return
        finally:
            SharedSteps.remove(path)
        assert self._conn is not None
        self._conn.skip_empty = True
        self._shared, self._seq = shared, 0

    def start(self) -> dict:
        self.spawn()
        try:
            return self.connect()
        except ProcessFailed as e:
            self.kill()
            raise ConnectorStartError(f"{self.name} failed to start: {e}.{self.tail_text()}") from None

    def kill(self) -> None:
        """End the connector's whole process tree: SIGTERM asks its supervisor to SIGKILL every descendant and
        reap them; SIGKILL to the process group is the fallback should the supervisor not exit in time."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._shared = None  # the next process maps a fresh file
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
                self._proc.send_signal(signal.SIGCONT)  # a supervisor the connector stopped gets its SIGTERM now
                self._proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("%s: supervisor pid %d did not exit %.0f s after SIGTERM; killing its process group",
                            self.label, self._proc.pid, KILL_WAIT_S)
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    self._proc.kill()
                try:
                    self._proc.wait(timeout=KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    log.warning("%s pid %d did not exit after SIGKILL", self.label, self._proc.pid)
        self._close_pid_pipe()

    def _close_pid_pipe(self) -> None:
        if self._pid_pipe is not None:
            os.close(self._pid_pipe)
            self._pid_pipe = None

    def close(self) -> None:
        """Ask the process to close its envs, then make sure it is gone and the socket removed."""
        if self._conn is not None and self.dead_reason is None and self._proc and self._proc.poll() is None:
            try:
                self.call({"op": "close"}, timeout_s=min(5.0, self.spec.call_timeout_s))
            except Exception as e:  # closing is best effort: the process is killed below anyway
                log.debug("%s close: %s", self.label, e)
            if self._proc is not None:
                try:
                    self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
        self.kill()
        self._listener.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    @property
    def pid(self) -> int | None:
        """The connector's own pid (the supervisor's child), once the supervisor has told it; else the supervisor's."""
        if self._child_pid is None and self._pid_pipe is not None:
            ready, _, _ = select.select([self._pid_pipe], [], [], PID_WAIT_S)
            data = os.read(self._pid_pipe, 4) if ready else b""
            if len(data) == 4:
                self._child_pid = int.from_bytes(data, sys.byteorder, signed=True)
            self._close_pid_pipe()
        if self._child_pid is not None:
            return self._child_pid
        return self._proc.pid if self._proc else None

    def tail_text(self, n: int = 15) -> str:
        """The process's last output lines, for an error message. Once it has exited, the drain thread is given
        up to OUTPUT_DRAIN_S to read what is still in the pipe: its last words are the ones that explain it."""
        if self._proc is not None and self._proc.poll() is not None and self._drain_thread is not None:
            self._drain_thread.join(OUTPUT_DRAIN_S)
        lines = list(self._tail)[-n:]
        if not lines:
            return " It printed nothing."
        return " Its last output lines:\n  " + "\n  ".join(lines)

    # ------------------------------------------------------------------------------- calls
    def send(self, msg: dict) -> None:
        self._op = msg.get("op")
        if self.dead_reason is not None or self._conn is None:
            raise ProcessFailed(self.dead_reason or "not connected")
        shared = self._shared
        try:
            if shared is not None and self._op == "step" and self._put_actions(shared, msg["actions"]):
                self._seq += 1
                shared.publish(shm.REQ_SEQ, shm.REQ_KIND, shm.KIND_SHARED, self._seq)
                if shared.slots[shm.CONNECTOR_WAITING]:
                    self._conn.send_wake()
                return
            body = self.codec.pack(msg)
            if shared is not None:  # announced on the counter, then sent as a frame
                self._seq += 1
                shared.publish(shm.REQ_SEQ, shm.REQ_KIND, shm.KIND_FRAME, self._seq)
            self._conn.send(body)
        except TypeError as e:
            raise EnvContractError(f"cannot send to {self.name}: {e}") from None
        except OSError as e:
            self.dead_reason = f"sending failed ({e})"
            raise ProcessFailed(self.dead_reason) from None

    @staticmethod
    def _put_actions(shared: SharedSteps, actions: Any) -> bool:
        out = shared.arrays["actions"]
        if type(actions) is not np.ndarray or actions.shape != out.shape or actions.dtype != out.dtype:
            return False
        out[...] = actions
        return True

    def _shared_reply(self, shared: SharedSteps) -> SharedReply:
        """A step reply read from the mapping (copies: the next step overwrites it)."""
        arrays = shared.arrays
        terminated: np.ndarray = arrays["terminated"].astype(bool)
        truncated: np.ndarray = arrays["truncated"].astype(bool)
        reply = SharedReply(ok=True, obs=arrays["obs"].copy(), rewards=arrays["rewards"].copy(),
                            terminated=terminated, truncated=truncated)
        ended = terminated | truncated
        if ended.any():
            final_obs: list[Any] = [None] * self.num_envs
            for i in np.flatnonzero(ended).tolist():
                final_obs[i] = arrays["final_obs"][i].copy()
            reply["final_obs"] = final_obs
        return reply

    def _recv(self, timeout_s: float) -> Any:
        if self.dead_reason is not None or self._conn is None:
            raise ProcessFailed(self.dead_reason or "not connected")
        shared = self._shared
        try:
            if shared is not None:
                deadline = time.monotonic() + timeout_s
                seq = shared.wait(shm.REP_SEQ, self._seq - 1, shm.POLAR_WAITING, self._conn, deadline)
                if seq != self._seq:
                    self.kill()
                    raise ProtocolError(f"{self.name}: its shared-memory reply counter says {seq}, expected {self._seq}; "
                                        "rep_seq must be set to the request's req_seq (docs/connector-protocol.md 4.7)")
                if shared.slots[shm.REP_KIND] == shm.KIND_SHARED:
                    self.last_io = time.monotonic()
                    return self._shared_reply(shared)
                timeout_s = max(deadline - time.monotonic(), 0.0)
            data = self._conn.recv(timeout_s)
        except ConnectorTimeout:
            raise ProcessFailed(f"no reply within {timeout_s:g} s (call_timeout_s); the process looks hung") from None
        except ConnectionClosed:
            code = self._proc.poll() if self._proc else None
            if code is None and self._proc is not None:
                try:
                    code = self._proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    code = None
            raise ProcessFailed("the process died" + (f" (exit code {code})" if code is not None else "")) from None
        except ProtocolError as e:  # over the size cap or garbage: the stream is unusable
            self.kill()
            raise ProtocolError(e.args[0] if str(e).startswith(self.name) else f"{self.name}: {e}") from None
        except OSError as e:
            raise ProcessFailed(f"receiving failed ({e})") from None
        self.last_io = time.monotonic()
        if self._op == "init":  # its spaces' arrays (Box low, high) come before the spaces are known
            self._budget_init_reply(data)
        try:
            return self.codec.unpack(data)
        except ProtocolError as e:  # the frame arrived whole, so the stream is still in step
            if self._conn.frames_received == 1:  # not a polar peer: nothing it says will make sense
                self.kill()
                raise ProtocolError(f"{self.name} {NOT_POLAR}: its first frame, the hello, cannot be decoded: {e}") from None
            raise ProtocolError(f"{self.name}: its reply to {self._op!r} cannot be decoded: {e}") from None

    def receive(self, timeout_s: float | None = None) -> dict:
        reply = self._recv(self.spec.call_timeout_s if timeout_s is None else timeout_s)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise ProtocolError(f"{self.name}: a reply must be a map with an 'ok' key, got {reply!r:.200}")
        if not reply["ok"]:
            err = reply.get("error") or {}
            kind, message, tb = err.get("kind"), err.get("message", "unknown error"), err.get("traceback", "")
            if kind == "start":  # one line; the connector's traceback only with --debug
                log.debug("%s start traceback:\n%s", self.name, tb)
                raise ConnectorStartError(message + (f"\n{tb}" if tb and log.isEnabledFor(logging.DEBUG) else ""),
                                          remote_traceback=tb)
            if kind in ("frame_size", "protocol"):
                raise ProtocolError(f"{self.name}: {message}")
            if kind == "contract":
                raise EnvContractError(message)
            text = f"{message} (in connector class {self.name}; traceback from the connector process below)\n{tb}" if tb else message
            raise ConnectorRemoteError(text, remote_traceback=tb)
        want = REPLY_KEYS.get(self._op or "", ())
        if self._op == "init" and reply.get("multi_agent"):
            want = MULTI_AGENT_INIT_KEYS
        missing = [k for k in want if k not in reply]
        if missing:
            raise ProtocolError(f"{self.name}: its reply to {self._op!r} lacks {missing} (see docs/connector-protocol.md)")
        return reply

    def call(self, msg: dict, timeout_s: float | None = None) -> dict:
        self.send(msg)
        return self.receive(timeout_s)

    def heartbeat(self, timeout_s: float) -> None:
        """Ping; on failure mark the process dead and kill it (the next call restarts it)."""
        try:
            self.call({"op": "ping"}, timeout_s)
        except ProcessFailed as e:
            self.dead_reason = f"heartbeat failed: {e}"
            log.warning("%s: %s", self.label, self.dead_reason)
            self.kill()

    # ------------------------------------------------------------------------------- recovery
    def recover(self, reason: str) -> None:
        """Kill, back off, start again; give up with ConnectorCrashed after ``max_restarts`` in a row.

        Failures are "in a row" unless the process served HEALTHY_ENV_STEPS env steps in between. The
        restarted process gets ``restarts`` one higher in ``init``, so its copies get fresh seeds.
        """
        while True:
            self.consecutive_failures += 1
            self.kill()
            if self.consecutive_failures > self.spec.max_restarts:
                raise ConnectorCrashed(
                    f"{self.name} ({self.label}) failed {self.consecutive_failures} times in a row, last because "
                    f"{reason}; gave up after max_restarts={self.spec.max_restarts}.{self.tail_text()}"
                )
            backoff = min(self.spec.restart_backoff_s * 2 ** (self.consecutive_failures - 1), self.spec.max_backoff_s)
            log.warning("%s (%s): %s; restart %d in %.2fs", self.name, self.label, reason, self.restarts + 1, backoff)
            time.sleep(backoff)
            self.restarts += 1
            try:
                self.spawn()
                self.connect()
                return
            except ProcessFailed as e:
                reason = str(e)
