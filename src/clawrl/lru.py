"""A small thread-safe LRU mapping (the gateway's caches of prefix renders, segment
tokenizations and rebuilt turns)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

_V = TypeVar("_V")


class LRU(Generic[_V]):
    """A thread-safe mapping that keeps the ``capacity`` most recently used entries."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[Hashable, _V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> _V | None:
        """The value, or ``None``; marks it recently used."""
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Hashable, value: _V) -> None:
        """Remember ``value`` (evicting the least recently used entry beyond capacity)."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def pop(self, keys: Iterable[Hashable]) -> None:
        """Forget these keys (those not remembered are ignored)."""
        with self._lock:
            for key in keys:
                self._data.pop(key, None)
