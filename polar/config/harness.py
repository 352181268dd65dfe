"""``harness:`` section. A discriminated union on ``type``.

- ``gymnasium``: any registered Gymnasium id, no code.
- ``envpool``: an EnvPool id (C++ vector envs: classic control, Atari, MuJoCo), no code.
- ``custom``: a user's connector class (or any-language connector command) in its own process.
- ``agent``: a black-box LLM agent harness (command, Python callable or preset) behind the gateway.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.secrets import from_env, secret_field


class AtariPresetConfig(StrictModel):
    """``preset: atari`` knobs; the defaults are the standard (Mnih et al. 2015 / SB3's AtariWrapper) ones."""

    noop_max: int = Field(30, ge=0, description="random no-ops after a reset")
    frame_skip: int = Field(4, ge=1, description="each action repeats this often; the last two frames max-pooled")
    screen_size: int = Field(84, ge=8, description="observations are screen_size x screen_size grey")
    frame_stack: int = Field(4, ge=1)
    episodic_life: bool = Field(True, description="a lost life ends the episode (the game resets only at game over)")
    fire_reset: bool = Field(True, description="press FIRE after a reset in games that need it (Breakout)")
    clip_reward: bool = Field(True, description="rewards become their sign (-1, 0, 1)")


class GymnasiumHarnessConfig(StrictModel):
    type: Literal["gymnasium"] = "gymnasium"
    id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    preset: Literal["atari"] | None = Field(None, description="standard wrappers: atari (polar.harness.atari)")
    wrappers: list[str] = Field(default_factory=list, description="'module:Wrapper' classes (Gymnasium wrappers "
                                "taking only the env), applied in order around the made env, e.g. "
                                "minigrid.wrappers:ImgObsWrapper; they name code (--trust-code to reopen the run)")
    atari: AtariPresetConfig = Field(default_factory=AtariPresetConfig, description="options of preset: atari")


class EnvPoolHarnessConfig(StrictModel):
    """An EnvPool id, stepped as one C++ vector env per rollout worker (``polar.harness.envpool_adapter``)."""

    type: Literal["envpool"] = "envpool"
    id: str = Field(description="an id of envpool.list_all_envs(), e.g. CartPole-v1, Pong-v5, Hopper-v4")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="EnvPool's own options of that id (max_episode_steps, episodic_life, "
        "num_threads, ...); num_envs and seed come from distribution and seed")


class ConnectorSpec(StrictModel):
    """Where the connector class lives and how polar talks to its process (see docs/connector-protocol.md)."""

    module: str | None = Field(None, description="Python module; resolved next to the config file, then the cwd")
    class_name: str | None = None
    command: list[str] | None = Field(None, description="non-Python connector: command that serves the wire protocol")
    config: dict[str, Any] = Field(default_factory=dict)
    copies_per_process: int | None = Field(
        None, ge=1, description="env copies hosted by one process; None = all envs of a vector env in one process"
    )
    transport: Literal["unix", "tcp"] = "unix"
    host: str = Field("127.0.0.1", description="tcp: address polar listens on; non-loopback needs a token")
    port: int = Field(0, ge=0, le=65535, description="tcp: 0 = any free port")
    token: str | None = secret_field("POLAR_CONNECTOR_TOKEN",
                                     "shared secret the connector sends in its hello; random when unset")
    call_timeout_s: float = Field(30.0, gt=0, description="a reset/step reply later than this counts as a hang")
    start_timeout_s: float = Field(60.0, gt=0)
    heartbeat_interval_s: float = Field(5.0, ge=0, description="ping an idle connector this often; 0 = off")
    max_restarts: int = Field(5, ge=0, description="consecutive failures tolerated before ConnectorCrashed")
    restart_backoff_s: float = Field(0.5, ge=0, description="first restart delay; doubles per consecutive failure")
    max_backoff_s: float = Field(10.0, ge=0)
    max_frame_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    compression: Literal["zstd", "lz4", "png", "jpeg"] | None = Field(
        None, description="compress large arrays (png/jpeg: uint8 images only)"
    )
    compress_min_bytes: int = Field(4096, ge=0)
    python: str | None = Field(None, description="interpreter for Python connectors; default: the one running polar")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the process")
    shared_memory: bool = Field(
        True, description="step arrays through a shared file mapping with a bounded spin when the connector offers it "
        "(same host, x86-64; docs/connector-protocol.md 4.7); false keeps every message on the socket")

    @model_validator(mode="after")
    def _check(self) -> ConnectorSpec:
        if self.command is None and not (self.module and self.class_name):
            raise ValueError(
                "connector_spec needs module + class_name (a Python connector) or command (any other language)"
            )
        if self.command is not None and (self.module or self.class_name):
            raise ValueError("connector_spec: give either module + class_name or command, not both")
        if self.command is not None and not self.command:
            raise ValueError("connector_spec.command is empty; give the program and its arguments as a list")
        if self.transport == "tcp" and not _is_loopback(self.host) and not (self.token or from_env("POLAR_CONNECTOR_TOKEN")):
            raise ValueError(
                f"connector_spec.host {self.host!r} is not a loopback address: set connector_spec.token to a "
                "shared secret (the connector sends it in its hello), better through $POLAR_CONNECTOR_TOKEN or "
                "$POLAR_CONNECTOR_TOKEN_FILE, which keep it out of the config; or listen on 127.0.0.1"
            )
        return self


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CustomHarnessConfig(StrictModel):
    type: Literal["custom"] = "custom"
    connector_spec: ConnectorSpec


class HarnessLimits(StrictModel):
    """Resource limits applied to a command harness (``setrlimit`` in the child; 0 = no limit)."""

    cpu_time_s: int = Field(600, ge=0, description="RLIMIT_CPU: CPU seconds before SIGXCPU/SIGKILL")
    memory_mb: int = Field(4096, ge=0, description="RLIMIT_AS: address space in MiB")
    open_files: int = Field(1024, ge=0, description="RLIMIT_NOFILE")
    file_size_mb: int = Field(1024, ge=0, description="RLIMIT_FSIZE: largest file the harness may write, MiB")
    output_bytes: int = Field(1_000_000, ge=1024, description="stdout+stderr kept; more marks the session ERROR")


class AgentHarnessConfig(StrictModel):
    """A black-box agent harness. Owned by polar.rollout.sessions; presets (claude_code, codex, ...) by polar.harness.agent.presets.

    Exactly one of ``command`` (a program, run in its own working directory and process group),
    ``callable`` (``module:function``, sync or async, called with ``base_url`` and ``task``) or
    ``preset`` is set. The task reaches a command on stdin (``task_input: stdin``), in a file
    (``task_input: file``, path in ``$POLAR_TASK_FILE``), or through ``{placeholders}`` in the
    command (``{prompt}``, ``{task_file}``, ``{workspace}``, ``{base_url}`` and any task field).
    """

    type: Literal["agent"] = "agent"
    command: list[str] | None = None
    callable: str | None = Field(None, description="'module:function' for a Python harness")
    preset: str | None = None
    preset_options: dict[str, Any] = Field(default_factory=dict)
    cwd: str | None = Field(None, description="template directory copied into each session's workspace")
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(300.0, gt=0, description="agent timeout: the harness is killed after this long")
    task_input: Literal["stdin", "file", "placeholders"] = "stdin"
    task_file: str = Field("task.json", description="file name (in the workspace) for task_input: file")
    limits: HarnessLimits = Field(default_factory=HarnessLimits)
    sandbox: dict[str, Any] | None = Field(
        None, description="a command's sandbox, as presets' preset_options.sandbox: runtime (auto|bwrap|none), "
        "network (gateway|host|none), user (auto|nobody|current), ro_binds (paths it may read, relative to the config)")

    @model_validator(mode="after")
    def _one_entry_point(self) -> AgentHarnessConfig:
        given = [k for k in ("command", "callable", "preset") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "an agent harness needs exactly one of 'command' (a program), 'callable' "
                f"('module:function') or 'preset'; got {given or 'none'}"
            )
        if self.sandbox is not None and not self.command:
            fix = ("a preset takes its sandbox under harness.preset_options.sandbox" if self.preset else
                   "a callable runs inside polar's process and cannot be sandboxed; run it as a command to sandbox it")
            raise ValueError(f"harness.sandbox applies to a command harness only: {fix}")
        if self.callable is not None and ":" not in self.callable:
            raise ValueError(f"'callable' must look like 'module:function' (got {self.callable!r})")
        return self


HarnessConfig = Annotated[
    GymnasiumHarnessConfig | EnvPoolHarnessConfig | CustomHarnessConfig | AgentHarnessConfig,
    Field(discriminator="type"),
]
