"""Agent harnesses as RL environments: runners, the session pipeline, verifiers and the rollout service.

- :mod:`polar.agentic.runners`: ``CommandRunner`` (any program) and ``CallableRunner`` (``module:function``);
- :mod:`polar.agentic.pipeline`: INIT → RUN → POST_RUN → DONE | ERROR | TIMEOUT (| CANCELLED);
- :mod:`polar.agentic.verifiers`: exact / numeric / regex / python_tests / workspace / ``module:function``;
- :mod:`polar.agentic.service`: the rollout service (HTTP and in-process), gateway-node registry in ``nodes``;
- :mod:`polar.agentic.local`: engine + gateway + rollout service in one process (``LocalStack``).
"""
