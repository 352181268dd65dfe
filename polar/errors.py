"""The exception tree. Every error polar raises on purpose is a ``PolarError``.

::

    PolarError
    ├── ConfigError            bad YAML, unknown key, wrong type (names the key path and a fix)
    ├── HarnessError           an environment or agent harness misbehaved
    │   ├── EnvContractError   reset/step returned the wrong shape, obs outside its space, ...
    │   └── ConnectorError     a connector process failed
    │       ├── ConnectorStartError    module/class missing, process failed to start
    │       ├── ConnectorRemoteError   the env raised inside reset/step (carries the traceback text)
    │       ├── ConnectorTimeout       a call or heartbeat ran past its deadline
    │       ├── ConnectorCrashed       the process died, or restarts were exhausted
    │       └── ProtocolError          a malformed frame or a frame over the size cap
    ├── AgentError             an agent's act() returned the wrong shapes or types
    ├── RunDirError            a run directory is missing, foreign, or already used
    ├── CheckpointError        a checkpoint is missing or unreadable
    ├── NonFiniteError         NaN or inf in observations, rewards or losses (names the source)
    ├── GatewayError           the model-API gateway or an inference engine failed
    ├── DeployError            `polar export` / `polar serve`: an agent that cannot be traced, a failed parity
    │                          check, a corrupt or foreign export
    └── DistributedError       the Ray backend could not start or reach its cluster

Messages say what was wrong, where, and how to fix it. The CLI prints them as one line
(a traceback only with ``--debug``).
"""

from __future__ import annotations

import errno


class PolarError(Exception):
    """Base class for every error polar raises deliberately."""


class ConfigError(PolarError):
    """A config file or override is malformed, has an unknown key, or a value of the wrong type."""


class HarnessError(PolarError):
    """An environment or agent harness did not behave as its contract says."""


class EnvContractError(HarnessError):
    """reset/step returned something outside the environment contract."""


class ConnectorError(HarnessError):
    """A connector process failed."""


class ConnectorStartError(ConnectorError):
    """The connector could not be started (missing module/class/method, bad config); ``remote_traceback`` holds
    the connector's traceback when it sent one."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class ConnectorRemoteError(ConnectorError):
    """The environment raised inside the connector process; ``remote_traceback`` holds its text."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class ConnectorTimeout(ConnectorError):
    """A call or heartbeat did not complete within its deadline."""


class ConnectorCrashed(ConnectorError):
    """The connector process died, or it kept dying past ``max_restarts``."""


class ProtocolError(ConnectorError):
    """A malformed frame, an unknown message type, or a frame over the configured size cap."""


class AgentError(PolarError):
    """An agent's ``act`` returned the wrong shapes or types."""


class RunDirError(PolarError):
    """A run directory is missing, belongs to another run, or cannot be written."""


class CheckpointError(PolarError):
    """A checkpoint is missing, incomplete, or unreadable."""


class NonFiniteError(PolarError):
    """An observation, reward or loss was NaN or infinite; the message names where it came from."""


class GatewayError(PolarError):
    """The model-API gateway or an inference engine failed."""


class DeployError(PolarError):
    """A policy could not be exported (untraceable, unsupported, failed parity) or an export could not be served."""


class DistributedError(PolarError):
    """The Ray backend could not start, reach its cluster, or place its actors."""


def os_cause(e: OSError) -> str:
    """'No space left on device (ENOSPC)': the OS's words and the errno name, for one-line errors."""
    name = errno.errorcode.get(e.errno or 0)
    words = e.strerror or type(e).__name__
    return f"{words} ({name})" if name else words
