"""``python -m clawrl.trainer ARGS``: the older spelling of ``python -m clawrl train ARGS`` (what
torchrun starts on each rank), kept so that existing launch scripts work.

It replaces this process with ``python -m clawrl train ARGS`` (same PID, environment and
arguments, so torchrun's ``RANK``/``WORLD_SIZE`` reach the rank) instead of importing the command
line: the trainer package sits below ``clawrl.cli`` and never imports it
(``tests/test_layers.py``)."""

import os
import sys

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "-m", "clawrl", "train", *sys.argv[1:]])
