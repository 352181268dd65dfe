"""The Python side of a connector process: hosts K copies of a user's connector class.

polar starts this as ``python -m polar.harness.connector.server --module M --class-name C``. It dials
back to the address in ``POLAR_CONNECTOR_ADDRESS``, says hello with ``POLAR_CONNECTOR_TOKEN``, then
answers ``init / reset / step / ping / close`` requests until the socket closes. Exceptions raised by
the user's code travel back as error replies with their traceback; the process keeps serving.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from polar.errors import ProtocolError
from polar.harness.connector import shm
from polar.harness.connector.shm import SharedSteps, fields_from_wire
from polar.harness.connector.spaces import infer_space, space_to_wire, stack, unbatch_actions
from polar.harness.connector.wire import PROTOCOL_VERSION, Codec, ConnectionClosed, FrameSocket, parse_address

log = logging.getLogger("polar.connector.server")
REQUIRED_METHODS = ("reset", "step")


class UserError(Exception):
    """A problem with the user's connector class; sent back as an error reply, never a crash."""

    def __init__(self, kind: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.kind, self.message, self.tb = kind, message, tb


def module_name(module: str) -> str:
    """``connector_spec.module`` as an import name: ``pkg/game.py`` is ``pkg.game``."""
    return module[:-3].replace("/", ".") if module.endswith(".py") else module


def module_not_found(module: str, search_path: list[str]) -> str:
    """The one wording for a connector module that is nowhere (here, and in ``polar run``'s check before start)."""
    where = " or ".join(search_path) or "the working directory"
    return (f"connector_spec.module {module!r} not found: looked next to the config file and in the working "
            f"directory ({where}). Fix the module name or put {module.split('.')[0]}.py there.")


def load_class(module: str, class_name: str, search_path: list[str]) -> type:
    """Import ``module`` (searched in ``search_path`` first) and return ``class_name`` from it."""
    for p in reversed(search_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    module = module_name(module)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise UserError("start", module_not_found(module, search_path)) from None
        raise UserError("start", f"importing connector module {module!r} failed: {e}", traceback.format_exc()) from None
    except Exception as e:
        raise UserError("start", f"importing connector module {module!r} raised {type(e).__name__}: {e}", traceback.format_exc()) from None
    cls = getattr(mod, class_name, None)
    if cls is None:
        from polar.config.base import did_you_mean

        names = [n for n, v in vars(mod).items() if isinstance(v, type) and v.__module__ == mod.__name__]
        raise UserError(
            "start",
            f"connector_spec.class_name {class_name!r} is not defined in module {module!r}"
            f"{did_you_mean(class_name, names)}. Classes there: {', '.join(sorted(names)) or 'none'}.",
        )
    from polar.harness.connector import Connector

    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None)) or getattr(cls, m) is getattr(Connector, m)]
    if missing:
        raise UserError(
            "start",
            f"connector class {class_name} has no {' or '.join(repr(m) for m in missing)} method. A connector defines "
            "__init__(self, config), reset(self) -> obs, step(self, action) -> (obs, reward, done, info), close(self).",
        )
    return cls


def _accepts_seed(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _sanitize_info(info: Any, where: str) -> dict:
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise UserError("contract", f"{where} returned info of type {type(info).__name__}; info must be a dict")
    return info


def copy_config(config: dict, copy: dict | None, vector_index: int) -> Any:
    """Copy ``vector_index``'s config: ``config`` with its own ``seed`` when polar sent one (init ``copies``)."""
    from polar.harness.connector import ConnectorConfig

    copy = copy or {}
    out = ConnectorConfig(config, worker_index=int(copy.get("worker_index", 0)),
                          vector_index=int(copy.get("vector_index", vector_index)), restarts=int(copy.get("restarts", 0)))
    if "seed" in copy:
        out["seed"] = copy["seed"]
    return out


class Host:
    """K copies of one connector class, stepped together with SAME_STEP autoreset."""

    def __init__(self, cls: type, config: dict, num_envs: int, copies: list | None = None) -> None:
        self.name = cls.__name__
        self.envs = []
        copies = copies if isinstance(copies, list) and len(copies) == num_envs else [None] * num_envs
        for i in range(num_envs):
            try:
                self.envs.append(cls(copy_config(config, copies[i], i)))
            except Exception as e:
                raise UserError("start", f"{self.name}.__init__ raised {type(e).__name__}: {e}", traceback.format_exc()) from None
        self.seedable = _accepts_seed(self.envs[0].reset)
        own_seeds = all(c is not None and "seed" in c for c in copies)
        if num_envs > 1 and not self.seedable and not own_seeds:
            log.warning("%s.reset() takes no seed and connector_spec.config has no integer seed: its %d copies may play "
                        "identical episodes. Accept `seed` in reset(self, seed=None), or add a seed to "
                        "connector_spec.config (each copy then gets its own).", self.name, num_envs)
        self.obs_space = getattr(self.envs[0], "observation_space", None)
        self.act_space = getattr(self.envs[0], "action_space", None)

    def _call(self, i: int, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.envs[i], method)(*args, **kwargs)
        except UserError:
            raise
        except Exception as e:
            raise UserError("remote", f"{self.name}.{method} raised {type(e).__name__}: {e}", traceback.format_exc()) from None

    def _reset_one(self, i: int, seed: int | None) -> tuple[Any, dict]:
        out = self._call(i, "reset", seed=seed) if (self.seedable and seed is not None) else self._call(i, "reset")
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            return out[0], out[1]  # the Gymnasium (obs, info) form
        return out, {}

    def describe(self) -> dict:
        if self.act_space is None:
            raise UserError(
                "start",
                f"connector class {self.name} declares no action_space; add a class attribute such as "
                "`action_space = gymnasium.spaces.Discrete(4)`",
            )
        reply = {"class_name": self.name, "action_space": space_to_wire(self.act_space), "reset_accepts_seed": self.seedable}
        reply["observation_space"] = space_to_wire(self.obs_space) if self.obs_space is not None else None
        return reply

    def reset(self, seeds: list | None, env_ids: list | None) -> dict:
        ids = range(len(self.envs)) if env_ids is None else env_ids
        seeds = seeds if seeds is not None else [None] * len(ids)
        pairs = [self._reset_one(i, s) for i, s in zip(ids, seeds, strict=False)]
        if self.obs_space is None:
            self.obs_space = infer_space(pairs[0][0], f"{self.name}.reset() observation")
        return {"obs": stack([p[0] for p in pairs]), "infos": [_sanitize_info(p[1], f"{self.name}.reset") for p in pairs]}

    def step(self, actions: Any) -> dict:
        n = len(self.envs)
        per_env = unbatch_actions(actions, n)
        if len(per_env) != n:
            raise UserError("contract", f"step got {len(per_env)} actions for {n} environment copies")
        obs_list: list[Any] = []
        infos: list[dict[str, Any] | None] = []
        final_obs: list[Any] | None = None  # per copy: the observation an episode ended on (None where it did not)
        final_infos: list[dict[str, Any] | None] | None = None
        rewards, terminated, truncated = [0.0] * n, [False] * n, [False] * n
        any_info = False
        i = 0
        try:  # one try around the hot loop: per-env wrappers cost more than the env on small games
            for i, (env, action) in enumerate(zip(self.envs, per_env, strict=False)):
                out = env.step(action)
                if type(out) is not tuple or len(out) not in (4, 5):
                    self._bad_step_result(out)
                if len(out) == 5:
                    obs, reward, term, trunc, info = out
                else:
                    obs, reward, done, info = out
                    trunc = bool(info.get("TimeLimit.truncated", False)) if info else False
                    term = bool(done) and not trunc
                rewards[i] = float(reward)
                if term or trunc:
                    terminated[i], truncated[i] = bool(term), bool(trunc)
                    if final_obs is None or final_infos is None:  # both set at once, on the first ended episode
                        final_obs, final_infos = [None] * n, [None] * n
                    final_obs[i], final_infos[i] = obs, _sanitize_info(info, f"{self.name}.step")
                    obs, info = self._reset_one(i, None)
                obs_list.append(obs)
                if info:
                    any_info = True
                infos.append(info)
        except UserError:
            raise
        except Exception as e:
            raise UserError("remote", f"{self.name}.step raised {type(e).__name__}: {e} (copy {i})", traceback.format_exc()) from None
        reply = {
            "obs": stack(obs_list),
            "rewards": np.array(rewards, dtype=np.float64),
            "terminated": np.array(terminated, dtype=bool),
            "truncated": np.array(truncated, dtype=bool),
        }
        if any_info:
            reply["infos"] = [_sanitize_info(info, f"{self.name}.step") for info in infos]
        if final_obs is not None:
            reply["final_obs"], reply["final_infos"] = final_obs, final_infos
        return reply

    def _bad_step_result(self, out: Any) -> None:
        got = f"a tuple of {len(out)} items" if isinstance(out, tuple) else type(out).__name__
        raise UserError(
            "contract",
            f"{self.name}.step returned {got}; expected (obs, reward, done, info) or (obs, reward, terminated, truncated, info)",
        )

    def close(self) -> None:
        for i, env in enumerate(self.envs):
            if callable(getattr(env, "close", None)):
                self._call(i, "close")


def _put_reply(shared: SharedSteps, reply: dict[str, Any]) -> bool:
    """Write a plain step reply into the mapping; False when it needs a frame (infos, other shapes or dtypes)."""
    arrays = shared.arrays
    obs, obs_out = reply["obs"], arrays["obs"]
    if "infos" in reply or type(obs) is not np.ndarray or obs.shape != obs_out.shape or obs.dtype != obs_out.dtype:
        return False
    final_obs, final_infos = reply.get("final_obs"), reply.get("final_infos")
    if final_obs is not None:
        if final_infos is not None and any(final_infos):
            return False
        final_out = arrays["final_obs"]
        for i, fo in enumerate(final_obs):
            if fo is not None:
                fo = np.asarray(fo)
                if fo.shape != final_out.shape[1:] or fo.dtype != final_out.dtype:
                    return False
                final_out[i] = fo
    obs_out[...] = obs
    arrays["rewards"][...] = reply["rewards"]
    arrays["terminated"][...] = reply["terminated"]
    arrays["truncated"][...] = reply["truncated"]
    return True


def _attach(msg: dict[str, Any]) -> SharedSteps:
    try:
        return SharedSteps.attach(str(msg["path"]), int(msg["size"]), fields_from_wire(msg.get("fields")))
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise UserError("remote", f"cannot map the shared_memory file: {type(e).__name__}: {e}") from None


def serve(address: str, token: str, module: str, class_name: str, search_path: list[str]) -> int:
    family, sockaddr = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(sockaddr)
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = FrameSocket(sock)
    codec = Codec()
    hello = {"type": "hello", "protocol": PROTOCOL_VERSION, "token": token, "pid": os.getpid(), "language": "python",
             "name": class_name}
    if shm.supported():
        hello["shared_memory"] = shm.SHM_VERSION
    conn.send(codec.pack(hello))
    host: Host | None = None
    shared: SharedSteps | None = None  # once polar has sent shared_memory: steps arrive in the mapping
    seen = 0  # the last request counter served
    try:
        while True:
            kind = shm.KIND_FRAME
            body: bytes | None
            if shared is not None:
                seen = shared.wait(shm.REQ_SEQ, seen, shm.CONNECTOR_WAITING, conn, None)
                kind = shared.slots[shm.REQ_KIND]
            if kind == shm.KIND_SHARED and shared is not None and host is not None:
                op = "step"
                try:
                    reply = host.step(shared.arrays["actions"].copy())
                    if _put_reply(shared, reply):
                        shared.publish(shm.REP_SEQ, shm.REP_KIND, shm.KIND_SHARED, seen)
                        if shared.slots[shm.POLAR_WAITING]:
                            conn.send_wake()
                        continue
                    reply["ok"] = True
                    body = codec.pack(reply)
                except UserError as e:
                    body = codec.pack({"ok": False, "error": {"kind": e.kind, "message": e.message, "traceback": e.tb}})
                except TypeError as e:
                    body = codec.pack({"ok": False, "error": {"kind": "contract", "message": f"{class_name}: {e}",
                                                              "traceback": ""}})
                attach = None
            else:
                try:
                    msg = codec.unpack(conn.recv())
                except ProtocolError as e:  # the stream is unusable: say why on stderr (polar quotes it) and stop
                    if isinstance(e, ConnectionClosed):
                        raise
                    sys.stderr.write(f"polar connector host: {e}\n")
                    return 1
                op = msg.get("op")
                codec, host, body, attach = _answer(msg, op, codec, conn, host, module, class_name, search_path)
            if body is None:  # close: reply and exit
                body = codec.pack({"ok": True})
                op = "close"
            if len(body) > conn.max_frame_bytes:
                msg_ = (
                    f"{class_name} reply to {op!r} is {len(body)} bytes, over max_frame_bytes={conn.max_frame_bytes}; "
                    "raise connector_spec.max_frame_bytes or set connector_spec.compression"
                )
                body = codec.pack({"ok": False, "error": {"kind": "frame_size", "message": msg_, "traceback": ""}})
            if shared is not None:
                shared.publish(shm.REP_SEQ, shm.REP_KIND, shm.KIND_FRAME, seen)
            conn.send(body)
            if op == "close":
                break
            if attach is not None:  # polar switches to the mapping once it has this reply; its counters start at 0
                shared, seen = attach, 0  # (not read from the slot: polar may already have sent its next request)
                conn.skip_empty = True
    except (ConnectionClosed, OSError):
        pass  # polar went away: exit quietly
    conn.close()
    return 0


def _answer(msg: dict[str, Any], op: Any, codec: Codec, conn: FrameSocket, host: Host | None, module: str,
            class_name: str, search_path: list[str]) -> tuple[Codec, Host | None, bytes | None, SharedSteps | None]:
    """The codec and host from now on, the reply frame to one request (None: close), and a mapping to switch to."""
    attach = None
    try:
        if op == "init":
            opts = msg.get("options") or {}
            codec = Codec(opts.get("compression"), int(opts.get("compress_min_bytes", 4096)))
            conn.max_frame_bytes = int(opts.get("max_frame_bytes", conn.max_frame_bytes))
            cls = load_class(module, class_name, search_path)
            host = Host(cls, msg.get("config") or {}, int(msg.get("num_envs", 1)), msg.get("copies"))
            reply = host.describe()
        elif op == "ping":
            reply = {}
        elif op == "close":
            if host is not None:
                host.close()
            return codec, host, None, None
        elif host is None:
            raise UserError("protocol", f"op {op!r} before init")
        elif op == "reset":
            reply = host.reset(msg.get("seeds"), msg.get("env_ids"))
        elif op == "step":
            reply = host.step(msg["actions"])
        elif op == "shared_memory":
            attach = _attach(msg)
            reply = {}
        else:
            raise UserError("protocol", f"unknown op {op!r}")
        reply["ok"] = True
        return codec, host, codec.pack(reply), attach
    except UserError as e:
        error = {"kind": e.kind, "message": e.message, "traceback": e.tb}
    except TypeError as e:  # a value msgpack cannot carry (from the user's obs or info)
        error = {"kind": "contract", "message": f"{class_name}: {e}", "traceback": ""}
    return codec, host, codec.pack({"ok": False, "error": error}), None


def _exit_with_parent(interval_s: float = 1.0) -> None:
    """Exit when polar dies, even if the env is stuck inside step (a closed socket would go unseen)."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="polar-parent-watch").start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="polar connector host (started by polar; not for direct use)")
    parser.add_argument("--module", required=True)
    parser.add_argument("--class-name", required=True)
    parser.add_argument("--search-path", action="append", default=[])
    args = parser.parse_args(argv)
    # stdout is not the channel: anything the env prints goes to stderr, which polar captures
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    address = os.environ.get("POLAR_CONNECTOR_ADDRESS")
    if not address:
        sys.stderr.write("POLAR_CONNECTOR_ADDRESS is not set; this process is started by polar\n")
        return 2
    _exit_with_parent()
    search_path = [str(Path(p)) for p in args.search_path]
    return serve(address, os.environ.get("POLAR_CONNECTOR_TOKEN", ""), args.module, args.class_name, search_path)


if __name__ == "__main__":
    sys.exit(main())
