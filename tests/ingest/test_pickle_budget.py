"""A pickle whose shared references expand past the budget (ingest/pickle_budget.py) is refused before anything
walks it, in both PyTorch formats; real files, shared tensors and deep-enough nestings still read."""

from __future__ import annotations

import io
import pickle
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from tensor_debugger.errors import FileProblem
from tensor_debugger.ingest.pickle_budget import MAX_DEPTH, MAX_OBJECTS, PickleTooLarge, check_pickles, check_reach
from tensor_debugger.ingest.tensor_files import open_tensor_file

from tests.support.bombs import hashed_laughs_pickle, laughs_pickle, laughs_pth
from tests.support.dumps import seeded


def test_shared_references_are_counted_each_time_they_are_reached() -> None:
    leaf = [1, 2]
    assert check_reach(leaf) == 3
    assert check_reach([leaf, leaf, leaf]) == 1 + 3 * 3
    assert check_reach({"a": leaf, "b": leaf}) == 1 + 2 * (1 + 3)  # keys count too
    assert check_reach(pickle.loads(laughs_pickle(10))) == 2**11 - 1
    with pytest.raises(PickleTooLarge, match=f"more than {MAX_OBJECTS:,} objects"):
        check_reach(pickle.loads(laughs_pickle(40)))


def test_a_shared_tuple_key_is_counted_too() -> None:
    key: Any = ()
    for _ in range(20):
        key = (key, key)  # 2^21 - 1 tuples to str() as a key path (to hash, 2^20 steps: built here at all)
    with pytest.raises(PickleTooLarge):
        check_reach({key: 1})


@pytest.mark.parametrize("bomb", [laughs_pickle(), hashed_laughs_pickle()], ids=["lists", "hashed key"])
def test_a_pickle_is_measured_before_it_is_unpickled(bomb: bytes) -> None:
    began = time.monotonic()
    with pytest.raises(PickleTooLarge, match="more than 1,000,000 objects"):
        check_pickles(io.BytesIO(bomb))
    assert time.monotonic() - began < 1
    check_pickles(io.BytesIO(laughs_pickle(10)))  # 2^11 - 1 lists: within the budget
    check_pickles(io.BytesIO(b"not a pickle"))  # left to the unpickler to refuse
    with pytest.raises(PickleTooLarge):  # cut short: what it built up to there (20 levels) is measured all the same
        check_pickles(io.BytesIO(bomb[: len(bomb) // 2]))


def test_every_object_a_pickle_makes_is_measured_not_only_the_one_it_returns() -> None:
    body = hashed_laughs_pickle()[2:-1]  # the dict, built, hashed and then dropped (POP) before a small result
    with pytest.raises(PickleTooLarge):
        check_pickles(io.BytesIO(b"\x80\x02" + body + b"0K\x07."))
    second = pickle.dumps(1, protocol=2) + laughs_pickle()  # the legacy format: several pickles one after another
    check_pickles(io.BytesIO(second), most=1)
    with pytest.raises(PickleTooLarge):
        check_pickles(io.BytesIO(second), most=2)


def test_depth_and_self_reference() -> None:
    deep: Any = []
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    assert check_reach(deep) == MAX_DEPTH
    with pytest.raises(PickleTooLarge, match=f"more than {MAX_DEPTH} levels"):
        check_reach([deep])
    # the same container, reached first near the root and then deeper down, is deeper there
    shallow: Any = []
    for _ in range(MAX_DEPTH // 2):
        shallow = [shallow]
    sunk: Any = shallow
    for _ in range(MAX_DEPTH // 2 + 1):
        sunk = [sunk]
    with pytest.raises(PickleTooLarge, match="levels"):
        check_reach([shallow, sunk])
    endless: list[Any] = []
    endless.append(endless)
    with pytest.raises(PickleTooLarge, match="holds itself"):
        check_reach(endless)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("hashed", [False, True], ids=["lists", "hashed key"])
def test_a_pickle_bomb_is_refused_at_once_naming_the_file(tmp_path: Path, legacy: bool, hashed: bool) -> None:
    path = laughs_pth(tmp_path / "laughs.pth", legacy=legacy, bomb=hashed_laughs_pickle() if hashed else None)
    assert path.stat().st_size < 2000
    began = time.monotonic()
    with pytest.raises(FileProblem) as info, open_tensor_file(path, "upload/laughs.pth"):
        pass
    assert time.monotonic() - began < 5
    assert info.value.file == "upload/laughs.pth"
    assert info.value.reason.startswith("refused: its pickle expands to more than 1,000,000 objects")


def test_a_self_holding_legacy_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "endless.pth"
    endless: list[Any] = []
    endless.append(endless)
    torch.save(endless, path, _use_new_zipfile_serialization=False)
    with pytest.raises(FileProblem, match="holds itself"), open_tensor_file(path, path.name):
        pass
    torch.save(endless, path)  # the zip format: the reader's own unpickler
    with pytest.raises(FileProblem, match="holds itself"), open_tensor_file(path, path.name):
        pass


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_shared_tensors_and_a_state_dict_still_read(tmp_path: Path, legacy: bool) -> None:
    shared = seeded((3, 4), 0)
    state = OrderedDict((f"layer{i}.weight", seeded((4, 4), i)) for i in range(50))
    obj = {"model": state, "tied": [shared, shared], "again": {"x": shared}}
    path = tmp_path / "model.pth"
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    with open_tensor_file(path, path.name) as opened:
        keys = [leaf.key_path for leaf in opened.leaves]
    assert ("tied", "0") in keys and ("tied", "1") in keys and ("again", "x") in keys
    assert len(keys) == 53
