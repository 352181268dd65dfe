"""Run by ``gpu_check.py --dry`` with ``.vllm-venv``'s Python: polar's NCCL weight-sync request bodies against vLLM.

argv[1]: ``[[name, dtype_name, shape], ...]`` (JSON) of a model's state dict. vLLM's own RL router (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``, ``/update_weight_version``) is served on
127.0.0.1 by uvicorn with an engine client that parses each body with vLLM's NCCL engine's own init/update types;
vLLM's own ``HTTPVLLMWeightSyncClient`` posts the bodies ``NCCLTrainerWeightTransferEngine`` sends (its
``trainer_init`` / ``send_weights`` without the NCCL broadcast), then the ``update_weight_version`` body polar's
``VllmNcclSender`` sends. Exit 0 and one line on stdout when every body was accepted and parsed.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import asdict
from typing import Any


def main() -> int:
    import requests
    import uvicorn
    from fastapi import FastAPI
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.nccl_common import worker_init_payload
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLWeightTransferEngine,
        NCCLWeightTransferInitInfo,
        NCCLWeightTransferUpdateInfo,
    )
    from vllm.entrypoints.rl.online.api_router import router

    meta = json.loads(sys.argv[1])
    seen: list[str] = []

    class Engine:  # the engine client's weight-transfer calls, parsed as the NCCL worker engine parses them
        async def init_weight_transfer_engine(self, request: Any) -> None:
            info = NCCLWeightTransferEngine.init_info_cls(**request.init_info)
            assert info.rank_offset == 1 and info.world_size == 2, info
            seen.append("init")

        async def start_weight_update(self) -> None:
            seen.append("start")

        async def update_weights(self, request: Any) -> None:
            info = NCCLWeightTransferEngine.update_info_cls(**request.update_info)
            assert info.names == [m[0] for m in meta] and info.shapes == [m[2] for m in meta], "metadata changed"
            seen.append("update")

        async def finish_weight_update(self, weight_version: str | None) -> None:
            seen.append("finish")

        async def update_weight_version(self, new_version: str) -> None:
            assert new_version == "1", new_version
            seen.append("version")

    app = FastAPI()
    app.include_router(router)
    app.state.engine_client = Engine()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise TimeoutError("uvicorn did not start in 30 s")
        time.sleep(0.05)
    try:
        url = f"http://127.0.0.1:{port}"
        client = HTTPVLLMWeightSyncClient(url, timeout=30)
        trainer = NCCLTrainerInitInfo("127.0.0.1", 29999, world_size=2, rank=0)  # what VllmNcclSender builds (1 worker)
        client.init_weight_transfer_engine(worker_init_payload(NCCLWeightTransferInitInfo(
            master_address=trainer.master_address, master_port=trainer.master_port, rank_offset=1,
            world_size=trainer.world_size, packed=trainer.packed,
            packed_buffer_size_bytes=trainer.packed_buffer_size_bytes, packed_num_buffers=trainer.packed_num_buffers)))
        client.start_weight_update()
        client.update_weights(asdict(NCCLWeightTransferUpdateInfo(
            names=[m[0] for m in meta], dtype_names=[m[1] for m in meta], shapes=[m[2] for m in meta])))
        client.finish_weight_update()
        resp = requests.post(f"{url}/update_weight_version", json={"new_version": "1"}, timeout=30)
        resp.raise_for_status()
        bad = requests.post(f"{url}/update_weights", json={"update_info": {"names": ["x"]}}, timeout=30)
        assert bad.status_code >= 400, f"a malformed update_info was accepted (HTTP {bad.status_code})"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert seen == ["init", "start", "update", "finish", "version"], seen
    print(f"vLLM weight-transfer request bodies ({len(meta)} tensors) accepted by vLLM's RL router and parsed by "
          f"its NCCL engine types over HTTP on 127.0.0.1 (NCCL broadcast itself needs a GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
