"""The ingest line's turns: round the clients, then round each client's sessions, each session's runs in order;
stopped, it answers None once to each taker after what waits."""

from __future__ import annotations

import threading

from tensor_debugger.ingest.fair_line import FairLine


def test_turns_go_round_clients_then_their_sessions() -> None:
    line: FairLine[str] = FairLine()
    for i in range(4):
        line.put("10.0.0.1", 1, f"a1-{i}")
    for i in range(2):
        line.put("10.0.0.1", 2, f"a2-{i}")
    line.put("10.0.0.2", 3, "b3-0")
    taken = [line.get() for _ in range(7)]
    assert taken == ["a1-0", "b3-0", "a2-0", "a1-1", "a2-1", "a1-2", "a1-3"]
    assert len(line) == 0


def test_a_stopped_line_gives_what_waits_then_none_to_each_taker() -> None:
    line: FairLine[int] = FairLine()
    line.put("", 1, 1)
    line.stop(2)
    assert [line.get(), line.get(), line.get()] == [1, None, None]


def test_get_waits_for_an_item() -> None:
    line: FairLine[int] = FairLine()
    got: list[int | None] = []
    taker = threading.Thread(target=lambda: got.append(line.get()))
    taker.start()
    line.put("", 1, 7)
    taker.join(10)
    assert got == [7]
