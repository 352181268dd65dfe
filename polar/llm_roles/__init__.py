"""LLMs in roles other than the trained policy: the reward designer (``reward_design``).

Code an LLM writes is untrusted: it runs in bubblewrap (``sandboxed_reward``), never in polar's process."""
