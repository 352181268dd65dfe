"""Test support that ships with polar: stand-ins for services a test or benchmark machine does not have.

- :mod:`polar.testing.standin`: stand-in vLLM and SGLang HTTP servers (and ``FixedEngine``, a zero-cost
  engine), for tests and benchmarks without a GPU (``python -m polar.testing.standin --api vllm``).

Nothing in the library imports this package; it sits on the top layer beside ``cli`` (docs/DEVELOPING.md).
"""
