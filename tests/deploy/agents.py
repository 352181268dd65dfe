"""User agents the exporter must refuse by name: one reads a tensor as a Python number, one keeps a dict state."""

import torch
from torch import nn

from polar import AgentBase


class ItemAgent(AgentBase):
    """Scales its logits by a Python float read from the observation: a trace would freeze that number."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def act(self, observation, internal_state=None, deterministic=False):
        scale = float(observation.abs().max())
        logits = self.net(observation) * scale
        return logits.argmax(-1), None, {"logits": logits, "values": logits.sum(-1)}


class DictStateAgent(AgentBase):
    """A recurrent agent whose state is a dict (the graph has positional state inputs only)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def get_initial_state(self, batch_size=1):
        return {"h": torch.zeros(batch_size, 2)}

    def act(self, observation, internal_state=None, deterministic=False):
        logits = self.net(observation) + internal_state["h"]
        return logits.argmax(-1), {"h": logits}, {"logits": logits, "values": logits.sum(-1)}
