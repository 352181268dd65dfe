"""After training: ``polar export`` (a checkpoint as an ONNX / TorchScript graph with a manifest, checked for
parity) and ``polar serve`` (an Open Inference Protocol v2 server with versions and rolling reload).

Layer: just below ``polar.cli``; it may import ``polar.trainers`` and everything below, and only the CLI imports it.
"""
