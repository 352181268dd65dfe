"""A gateway node in its own process, for tests that kill one: the scripted oracle engine (tokenizer
only, no weights, so it starts in seconds) behind a real gateway, registered with a rollout service
and heartbeating until it is killed.

``python -m tests.agent_support.gateway_node SERVICE_URL NODE_ID HEARTBEAT_INTERVAL_S`` (the service token on stdin)
"""

import asyncio
import sys


def main() -> None:
    from polar.config.gateway import GatewayConfig
    from polar.gateway import GatewayServer
    from polar.inference.scripted import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from polar.rollout.sessions.nodes import heartbeat_loop
    from tests.agent_support.helpers import oracle_script

    service_url, node_id, interval_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    service_token = sys.stdin.readline().strip()
    tok = build_tiny_tokenizer()
    engine = ScriptedEngine(tok, oracle_script(tok), model_name="tiny")
    server = GatewayServer(GatewayConfig(accept_any_model=True), engine=engine).start()
    asyncio.run(heartbeat_loop(service_url, node_id, server.url, lambda: {"node": node_id}, interval_s,
                              service_token=service_token))


if __name__ == "__main__":
    main()
