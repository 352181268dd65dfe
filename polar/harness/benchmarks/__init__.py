"""Public benchmarks that run offline, each a harness polar names in YAML: a generated task source
(``tasks: {source: humaneval | reasoning_gym | lm_eval}``), the one-call chat harness
(:func:`polar.harness.benchmarks.chat.answer`), and a verifier (``humaneval``, ``reasoning_gym``, ``lm_eval``)."""
