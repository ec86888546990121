"""clawrl: RL for agent policies through the agent's real harness."""

__version__ = "0.1.0"
