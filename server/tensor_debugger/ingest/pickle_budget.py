"""How far a pickle's objects reach once every shared reference is followed, measured before anything expands them.

A pickle may refer to one object many times (its memo): 40 levels of `x = [x, x]` are a few hundred bytes, unpickle
to 41 small lists, and are a tree of 2^41 nodes to whatever walks them as a tree (the `.pth` resolver and the
flatteners, which give each leaf its key path), or hashes them (a tuple used as a dict key is hashed element by
element, while it is unpickled). The budget: `MAX_OBJECTS` nodes of that tree, shared references counted each
time they are reached, and `MAX_DEPTH` levels of nesting. A state dict of a large model is a few thousand nodes,
3 or 4 deep; an optimizer's state a few per parameter.

`check_pickles` measures a pickle before it is unpickled, by reading its opcodes (as pickletools describes them)
and building only the shape of what they make; `check_reach` measures an object already unpickled (what torch.load
returns). Both count a tree without expanding it: each distinct container once, its count remembered, every other
reference to it adding that count.
"""

from __future__ import annotations

import pickletools
import struct
from collections.abc import Iterable, Mapping
from typing import IO, Any

MAX_OBJECTS = 1_000_000  # nodes of the expanded tree: containers, keys and leaves, shared ones each time reached
MAX_DEPTH = 100  # levels of nested containers


class PickleTooLarge(ValueError):  # noqa: N818 (reads as the refusal it is)
    """A pickle whose expanded tree is past the budget: refused before anything expands it."""


def check_reach(obj: Any) -> int:
    """The number of nodes of `obj`'s tree (dicts, lists and tuples nested, with dict keys; every other object a
    leaf), counted with shared references counted each time they are reached. Raises PickleTooLarge past
    MAX_OBJECTS nodes or MAX_DEPTH levels, or for a container that holds itself (an endless tree)."""
    return _Reach().count(obj, 1)


def check_pickles(stream: IO[bytes], most: int = 1) -> None:
    """Read the opcodes of up to `most` pickles one after another in `stream` (the legacy PyTorch format is five),
    building the shape of every object they make, and raise PickleTooLarge if any of those objects (not only what
    a pickle returns: what it hashes or drops on the way too) is past the budget. Unpickles nothing, calls nothing.
    Bytes that are no pickle end the reading quietly: the unpickler then says what is wrong with them."""
    shapes = _Shapes(stream)
    try:
        for _ in range(most):
            shapes.read()
    except (ValueError, EOFError, IndexError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        pass  # no (more) pickle here, or a damaged one: what was built up to there is measured all the same
    reach = _Reach()
    for node in shapes.nodes:
        reach.count(node, 1)


class _Node:
    """A container (or an object made by a call) the pickle builds: what a walk of it would reach."""

    __slots__ = ("children",)

    def __init__(self, children: Iterable[Any] = ()) -> None:
        self.children = list(children)


_LEAF = object()  # a number, a string, a global, a storage: nothing below it


class _Leaves(int):
    """A tuple of leaves the pickle builds, kept as its count of nodes (itself and its leaves): it can never change,
    so nothing more of it is needed."""

    __slots__ = ()


_EMPTY_TUPLE = _Leaves(1)
_MARK = object()


# what each opcode does to the shapes (pickletools describes each; the few that take something off the stack and
# put nothing back are kinds of their own)
_LEAF_OPS = [
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING", "SHORT_BINSTRING",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
    "BINUNICODE8", "FLOAT", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE", "GLOBAL", "PERSID", "EXT1", "EXT2", "EXT4",
    "NEXT_BUFFER",
]  # fmt: skip
_KINDS = {
    **{name: "leaf" for name in _LEAF_OPS},
    **{name: "nothing" for name in ("PROTO", "FRAME", "READONLY_BUFFER")},
    **{name: "empty" for name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "EMPTY_SET")},
    **{name: "get" for name in ("GET", "BINGET", "LONG_BINGET")},
    **{name: "put" for name in ("PUT", "BINPUT", "LONG_BINPUT")},
    **{name: "from_mark" for name in ("LIST", "TUPLE", "DICT", "FROZENSET", "OBJ", "INST")},
    **{name: "into_top" for name in ("APPENDS", "SETITEMS", "ADDITEMS")},
    "MARK": "mark", "MEMOIZE": "memoize", "STOP": "stop", "TUPLE1": "tuple", "TUPLE2": "tuple", "TUPLE3": "tuple",
    "APPEND": "add", "BUILD": "add", "SETITEM": "add", "REDUCE": "call", "NEWOBJ": "call", "NEWOBJ_EX": "call",
    "BINPERSID": "swap", "STACK_GLOBAL": "swap", "POP": "pop", "POP_MARK": "pop_mark", "DUP": "dup",
}  # fmt: skip
_TAKES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "APPEND": 1, "BUILD": 1, "SETITEM": 2, "REDUCE": 2, "NEWOBJ": 2,
          "NEWOBJ_EX": 3, "BINPERSID": 1, "STACK_GLOBAL": 2, "POP": 1}  # fmt: skip
_LENGTHS = {-2: (1, False), -3: (4, True), -4: (4, False), -5: (8, False)}  # bytes of a length, and its signedness


# the kinds, as small numbers for the reading loop
(LEAF, NOTHING, EMPTY, EMPTY_TUPLE, GET, PUT, FROM_MARK, FROM_MARK_TUPLE, INTO_TOP, MARK, MEMOIZE, STOP, TUPLE_N, ADD,
 CALL, SWAP, POP, POP_MARK, DUP) = range(19)  # fmt: skip
_KIND_NUMBERS = {
    "leaf": LEAF, "nothing": NOTHING, "empty": EMPTY, "get": GET, "put": PUT, "from_mark": FROM_MARK,
    "into_top": INTO_TOP, "mark": MARK, "memoize": MEMOIZE, "stop": STOP, "tuple": TUPLE_N, "add": ADD, "call": CALL,
    "swap": SWAP, "pop": POP, "pop_mark": POP_MARK, "dup": DUP,
}  # fmt: skip
_FIXED = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


# an opcode: its kind, the items it takes off the stack, its argument (pickletools' n: bytes of the argument when
# >= 0, a line when -1, a length of -2 to -5's bytes first), the lines of a line argument, and whether it is GET or
# PUT with the memo index as a decimal line
_Op = tuple[int, int, int, int, bool]


def _opcodes() -> list[_Op | None]:
    """The opcodes by their byte (None: no opcode)."""
    table: list[_Op | None] = [None] * 256
    for op in pickletools.opcodes:
        n = op.arg.n if op.arg is not None else 0
        lines = 2 if op.arg is not None and op.arg.name == "stringnl_noescape_pair" else 1
        kind = _KIND_NUMBERS[_KINDS[op.name]]
        if op.name == "EMPTY_TUPLE":
            kind = EMPTY_TUPLE
        elif op.name == "TUPLE":
            kind = FROM_MARK_TUPLE
        table[ord(op.code)] = (kind, _TAKES.get(op.name, 0), n, lines, op.name in ("GET", "PUT"))
    return table


class _Window:
    """The stream's bytes from where the reading is, read ahead a MiB at a time. The reading loop reads `data` at
    `at` itself while enough is there (`ahead`), and syncs with `at` before calling the rest."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.data = b""
        self.at = 0

    def ahead(self, n: int) -> None:
        """At least `n` bytes after `at` in `data`, where the stream has them."""
        if self.at + n > len(self.data):
            self.data = self.data[self.at :] + self.stream.read(max(n, 1 << 20))
            self.at = 0

    def take(self, n: int) -> bytes:
        self.ahead(n)
        if n > len(self.data) - self.at:
            raise EOFError("cut short")
        got = self.data[self.at : self.at + n]
        self.at += n
        return got

    def skip(self, n: int) -> None:
        while n > 0:  # a MiB at a time: a pickle may hold gigabytes of bytes
            step = min(n, 1 << 20)
            self.take(step)
            n -= step

    def line(self) -> bytes:
        end = self.data.find(b"\n", self.at)
        while end < 0:
            more = self.stream.read(1 << 20)
            if not more or len(self.data) - self.at > 1 << 16:
                raise ValueError("no newline")
            self.data = self.data[self.at :] + more
            self.at = 0
            end = self.data.find(b"\n")
        got = self.data[self.at : end]
        self.at = end + 1
        return got


def _tuple_of(items: list[Any]) -> Any:
    """A tuple of `items` as the reading keeps it: a tuple of leaves is only its count of nodes (itself and its
    leaves: it can never change), any other a `_Node`."""
    for item in items:
        if item is not _LEAF:
            return _Node(items)
    if len(items) >= MAX_OBJECTS:
        raise PickleTooLarge(_too_many())
    return _Leaves(len(items) + 1)


class _Shapes:
    """The pickle machine, with every object a `_Node` of what it holds (or `_LEAF`; a tuple of leaves its count).
    An object made by a call (a tensor rebuilt, an OrderedDict, a set) holds what its arguments hold; a persistent
    id (a storage) and a global are leaves."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.nodes: list[_Node] = []
        self.table = _opcodes()
        self.window = _Window(stream)

    def read(self) -> None:
        """One pickle, up to its STOP."""
        stack: list[Any] = []
        memo: dict[int, Any] = {}
        window, table, nodes = self.window, self.table, self.nodes
        unpack = struct.unpack_from
        data, at = window.data, window.at
        while True:
            if at + 9 > len(data):  # an opcode and a fixed argument of up to 8 bytes, read in place below
                window.at = at
                window.ahead(9)
                data, at = window.data, window.at
                if at >= len(data):
                    raise EOFError("cut short")
            op = table[data[at]]
            if op is None:
                raise ValueError("no opcode")
            kind, takes, n, lines, memo_text = op
            at += 1
            arg: Any = 0
            if n > 0:
                if at + n > len(data):
                    raise EOFError("cut short")
                if n in _FIXED:
                    arg = unpack(_FIXED[n], data, at)[0]
                at += n
            elif n < 0:
                window.at = at
                if n == -1:
                    text = b"".join(window.line() for _ in range(lines))
                    arg = int(text) if memo_text else 0
                else:
                    width, signed = _LENGTHS[n]
                    length = int.from_bytes(window.take(width), "little", signed=signed)
                    if length < 0:
                        raise ValueError("negative length")
                    window.skip(length)
                data, at = window.data, window.at
            if takes:
                taken = stack[-takes:]
                if len(taken) != takes or _MARK in taken:
                    raise IndexError("stack underflow")
                del stack[-takes:]
            if kind == PUT:
                memo[arg] = stack[-1]
            elif kind == GET:
                stack.append(memo[arg])
            elif kind in (LEAF, SWAP):
                stack.append(_LEAF)
            elif kind == MEMOIZE:
                memo[len(memo)] = stack[-1]
            elif kind == MARK:
                stack.append(_MARK)
            elif kind == FROM_MARK_TUPLE:
                stack.append(self._kept(_tuple_of(_after_mark(stack))))
            elif kind == TUPLE_N:
                stack.append(self._kept(_tuple_of(taken)))
            elif kind == EMPTY_TUPLE:
                stack.append(_EMPTY_TUPLE)
            elif kind == CALL:  # the callable itself is a global: a leaf
                stack.append(self._kept(_tuple_of([x for arg_ in taken[1:] for x in _held(arg_)])))
            elif kind in (EMPTY, FROM_MARK):
                node = _Node(_after_mark(stack) if kind == FROM_MARK else ())
                nodes.append(node)
                stack.append(node)
            elif kind in (ADD, INTO_TOP):  # an object's state (BUILD) is what it holds too
                self._into_top(stack, taken if kind == ADD else _after_mark(stack))
            elif kind == POP_MARK:
                _after_mark(stack)
            elif kind == DUP:
                stack.append(stack[-1])
            elif kind == STOP:
                window.at = at
                return
            # NOTHING and POP: done

    def _kept(self, made: Any) -> Any:
        if isinstance(made, _Node):
            self.nodes.append(made)
        return made

    def _into_top(self, stack: list[Any], items: list[Any]) -> None:
        if not stack or stack[-1] is _MARK:
            raise IndexError("stack underflow")
        if not isinstance(stack[-1], _Node):  # added to what is no container: the unpickler will say
            node = _Node([stack[-1]])
            self.nodes.append(node)
            stack[-1] = node
        stack[-1].children.extend(items)


def _held(obj: Any) -> list[Any]:
    """What a call's argument puts into what the call makes: a tuple's items, or the argument itself."""
    if isinstance(obj, _Node):
        return obj.children
    if type(obj) is _Leaves:
        return [_LEAF] * (obj - 1)
    return [obj]


def _after_mark(stack: list[Any]) -> list[Any]:
    """Pop what lies above the topmost mark, and the mark."""
    for at in range(len(stack) - 1, -1, -1):
        if stack[at] is _MARK:
            items = stack[at + 1 :]
            del stack[at:]
            return items
    raise IndexError("no mark")


class _Reach:
    def __init__(self) -> None:
        # container id -> (nodes of its tree, levels of containers in it); the objects are alive, so ids are stable
        self.counted: dict[int, tuple[int, int]] = {}
        self.open: set[int] = set()  # the containers being counted, from the root down

    def count(self, obj: Any, depth: int) -> int:
        """The nodes of `obj`'s tree, `obj` being at `depth` levels of containers (itself included)."""
        if type(obj) is _Leaves:  # a tuple of leaves: its count, one level
            _check_depth(depth)
            return obj
        children = _children(obj)
        if children is None:
            return 1
        key = id(obj)
        if key in self.counted:
            nodes, levels = self.counted[key]
            _check_depth(depth + levels - 1)
            return nodes
        if key in self.open:
            raise PickleTooLarge("its pickle holds a container that holds itself: an endless nesting")
        _check_depth(depth)
        self.open.add(key)
        total, levels = 1, 1
        for child in children:
            if child is _LEAF:
                total += 1
                continue
            total += self.count(child, depth + 1)
            if total > MAX_OBJECTS:
                raise PickleTooLarge(_too_many())
            if type(child) is _Leaves:
                levels = max(levels, 2)
            elif id(child) in self.counted:
                levels = max(levels, 1 + self.counted[id(child)][1])
        self.open.discard(key)
        self.counted[key] = (total, levels)
        return total


def _too_many() -> str:
    return (
        f"its pickle expands to more than {MAX_OBJECTS:,} objects, shared references counted each time they are "
        "reached (a pickle bomb?); refused before it was expanded"
    )


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise PickleTooLarge(f"its pickle nests containers more than {MAX_DEPTH} levels deep")


def _children(obj: Any) -> Iterable[Any] | None:
    """What a tree walk visits below `obj`; None for a leaf."""
    if isinstance(obj, _Node):
        return obj.children
    if isinstance(obj, Mapping):
        return (x for item in obj.items() for x in item)
    if isinstance(obj, list | tuple):
        return obj
    return None
