"""docs/connector-protocol.md shows real bytes: its opening-exchange dump and space example are checked here.

The dump is what polar's own encoder puts on the socket (a real connector process records the frames),
so a change to the hello, ``init`` or the framing that the document does not follow fails this test,
which prints the dump to paste.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
from gymnasium import spaces

from polar.config.harness import ConnectorSpec
from polar.harness.connector.process import ConnectorProcess
from polar.harness.connector.spaces import space_from_wire, space_to_wire
from polar.harness.connector.wire import Codec

from .conftest import CONNECTORS_DIR

DOC = Path(__file__).resolve().parents[2] / "docs" / "connector-protocol.md"
CAPTURE = CONNECTORS_DIR / "capture_connector.py"


def hexdump(data: bytes) -> str:
    """``offset  16 hex bytes  ascii`` lines, as in the document."""
    rows = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"{i:04x}  {' '.join(f'{b:02x}' for b in chunk):<47}  {text}")
    return "\n".join(rows)


def captured_frames(tmp_path: Path) -> list[bytes]:
    """The hello, init and init reply of a real session (the spec the document names: token s3cret, 1 copy)."""
    out = tmp_path / "frames.json"
    spec = ConnectorSpec(command=[sys.executable, str(CAPTURE), str(out)], token="s3cret", config={"size": 8},
                         heartbeat_interval_s=0, start_timeout_s=30.0)
    proc = ConnectorProcess(spec, 1)
    try:
        proc.start()
    finally:
        proc.close()
    return [bytes.fromhex(h) for _, h in json.loads(out.read_text())]


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    return text[start : text.index("\n#", start + len(title))]


def documented_frames() -> list[bytes]:
    blocks = re.findall(r"```text\n(.*?)```", section("### 4.5"), re.S)
    frames = []
    for block in blocks:
        rows = [line[6:53] for line in block.splitlines() if re.match(r"[0-9a-f]{4}  [0-9a-f]{2} ", line)]
        frames.append(bytes.fromhex("".join(rows).replace(" ", "")))
    return frames


def test_documented_opening_exchange_is_what_polar_sends(tmp_path):
    frames = captured_frames(tmp_path)
    dumps = "\n\n".join(f"```text\n{hexdump(f)}\n```" for f in frames)
    assert documented_frames() == frames, f"update docs/connector-protocol.md section 4.5 to:\n{dumps}"
    hello, init, reply = (Codec().unpack(f[4:]) for f in frames)
    assert all(int.from_bytes(f[:4], "big") == len(f) - 4 for f in frames)  # the header counts the body only
    assert hello == {"type": "hello", "protocol": 1, "token": "s3cret", "pid": 4242, "language": "python"}
    assert init["op"] == "init" and init["num_envs"] == 1 and init["config"] == {"size": 8}
    assert reply["class_name"] == "LineWalk"


def test_documented_space_encoding_decodes_to_the_space_it_describes():
    (example,) = re.findall(r"```json\n(.*?)```", section("**Spaces**"), re.S)
    space = space_from_wire(json.loads(example))
    assert space == spaces.Dict({
        "image": spaces.Box(0, 255, (64, 64, 3), np.uint8),
        "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "key": spaces.Discrete(4),
        "doors": spaces.MultiBinary(3),
        "tools": spaces.MultiDiscrete([5, 2]),
    })
    assert space_from_wire(space_to_wire(space)) == space  # what polar's Python host sends decodes the same
