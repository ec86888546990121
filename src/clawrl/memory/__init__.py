"""Preference memory: directives a user gave (judges' hindsight hints, feedback comments, or by
hand) kept as short entries that the gateway adds to the system message of the user's main
calls (``clawrl serve --memory``), so a preference stated in one session shapes the next.

* :mod:`clawrl.memory.rules`: add, merge a near-duplicate, or replace a contradicted entry;
* :mod:`clawrl.memory.keeper`: :class:`MemoryKeeper` takes new directives from the store and
  keeps the cap;
* :mod:`clawrl.memory.prompt`: where the entries go in a prompt, and how a recorded turn's
  memory is put back or left out.

The entries live in the store (``memory_entries``, :mod:`clawrl.store.memory`); each turn
records what it got (``TurnRecord.memory``).
"""

from clawrl.memory.keeper import MemoryKeeper, MemorySnapshot, entry_json
from clawrl.memory.prompt import (
    MEMORY_HEADER,
    MemoryOptions,
    apply_memory,
    memory_block,
    with_memory,
    without_memory,
)
from clawrl.memory.rules import Decision, contradicts, decide

__all__ = [
    "MEMORY_HEADER",
    "Decision",
    "MemoryKeeper",
    "MemoryOptions",
    "MemorySnapshot",
    "apply_memory",
    "contradicts",
    "decide",
    "entry_json",
    "memory_block",
    "with_memory",
    "without_memory",
]
