"""r1: RL for LLM agents over a step-level MDP, in plain PyTorch.

See README.md for the commands and ../docs for the design; each module's
docstring says what it owns.
"""
