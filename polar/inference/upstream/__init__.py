"""Upstream engines: vLLM and SGLang servers, several replicas, session-sticky routing, failover, weight sync.

By concern:

- :mod:`.config`: ``UpstreamConfig`` (kind, replica URLs, tokenizer, timeouts);
- :mod:`.tokenizer`: the served model's tokenizer on polar's side (the gateway tokenizes), its stop ids;
- :mod:`.wire`: vLLM's and SGLang's token-id request bodies and their stream and JSON answers;
- :mod:`.replicas`: the replica set: sticky (rendezvous-hash) and least-loaded routing, failover cooldowns,
  health probes;
- :mod:`.sync`: weight sync into every replica, checked by logprobs, rolled back on failure;
- :mod:`.engine`: ``UpstreamEngine``, the :class:`~polar.inference.base.Engine` composed of the above.

Replicas polar launches and supervises itself are :mod:`polar.inference.vllm_launcher`.
"""

from polar.inference.upstream.config import UPSTREAM_KINDS, UpstreamConfig, UpstreamKind
from polar.inference.upstream.engine import UpstreamEngine
from polar.inference.upstream.sync import UpstreamWeightSync

__all__ = ["UPSTREAM_KINDS", "UpstreamConfig", "UpstreamEngine", "UpstreamKind", "UpstreamWeightSync"]
