"""Agent harnesses as RL environments: runners, the session pipeline, verifiers and the rollout service.

- :mod:`polar.harness.agent.runners`: ``CommandRunner`` (any program) and ``CallableRunner`` (``module:function``);
- :mod:`polar.rollout.sessions.pipeline`: INIT → RUN → POST_RUN → DONE | ERROR | TIMEOUT (| CANCELLED);
- :mod:`polar.harness.agent.verifiers`: exact / numeric / regex / python_tests / workspace / ``module:function``;
- :mod:`polar.rollout.sessions.service`: the rollout service (HTTP and in-process), gateway-node registry in ``nodes``;
- :mod:`polar.rollout.sessions.local`: engine + gateway + rollout service in one process (``LocalStack``);
- :mod:`polar.rollout.sessions.collector`: the agent runs' collectors (``SessionCollector``: groups of sessions for
  GRPO, with task sampling from :mod:`polar.rollout.sessions.task_sampling`; ``DemonstrationCollector``: SFT's
  minibatches), and :mod:`polar.rollout.sessions.stats`: what a batch of sessions did.
"""
