"""The line of ingests waiting for a slot, taken in turns rather than in the order they came: one client's
hundred runs do not make another's one run wait behind them all.

Turns go round the clients (a request's address), and within a client round its sessions; a session's runs go
in the order they came. So a client uploading to three sessions while another uploads one run gets every other
slot for itself, and the other's run is next but one (or next, when its client's turn comes first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairLine(Generic[T]):
    """Items waiting, taken round-robin over clients, then over each client's groups (sessions), each group's in
    order; `get` blocks until one waits or the line is stopped."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[str, OrderedDict[int, deque[T]]] = OrderedDict()
        self._stops = 0
        self._ready = threading.Condition()

    def put(self, client: str, group: int, item: T) -> None:
        with self._ready:
            self._waiting.setdefault(client, OrderedDict()).setdefault(group, deque()).append(item)
            self._ready.notify()

    def stop(self, takers: int) -> None:
        """After the items waiting now are taken, `get` answers None `takers` times (once to each taker)."""
        with self._ready:
            self._stops += takers
            self._ready.notify_all()

    def __len__(self) -> int:
        with self._ready:
            return sum(len(items) for groups in self._waiting.values() for items in groups.values())

    def get(self) -> T | None:
        """The next item in turn, or None once stopped and nothing waits."""
        with self._ready:
            while not self._waiting and not self._stops:
                self._ready.wait()
            if not self._waiting:
                self._stops -= 1
                return None
            client, groups = next(iter(self._waiting.items()))
            group, items = next(iter(groups.items()))
            item = items.popleft()
            if items:
                groups.move_to_end(group)  # the client's next turn is its next session's
            else:
                del groups[group]
            if groups:
                self._waiting.move_to_end(client)  # the next turn is the next client's
            else:
                del self._waiting[client]
            return item
