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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Op:
    kind: str
    takes: int  # items taken off the stack
    argument: int  # pickletools' n: bytes of the argument (>= 0), a line (-1), or a length of -2 to -5's bytes first
    lines: int  # lines of a line argument
    memo_text: bool  # GET and PUT: the memo index as a decimal line


def _opcodes() -> dict[int, _Op]:
    table = {}
    for op in pickletools.opcodes:
        n = op.arg.n if op.arg is not None else 0
        lines = 2 if op.arg is not None and op.arg.name == "stringnl_noescape_pair" else 1
        table[ord(op.code)] = _Op(_KINDS[op.name], _TAKES.get(op.name, 0), n, lines, op.name in ("GET", "PUT"))
    return table


class _Window:
    """The stream's bytes from where the reading is, read ahead a MiB at a time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.data = b""
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            self.data = self.data[self.at :] + self.stream.read(max(n, 1 << 20))
            self.at = 0
            if n > len(self.data):
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


class _Shapes:
    """The pickle machine, with every object a `_Node` of what it holds (or `_LEAF`). An object made by a call
    (a tensor rebuilt, an OrderedDict, a set) holds what its arguments hold; a persistent id (a storage) and a
    global are leaves."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.nodes: list[_Node] = []
        self.table = _opcodes()
        self.window = _Window(stream)

    def read(self) -> None:
        """One pickle, up to its STOP."""
        stack: list[Any] = []
        memo: dict[int, Any] = {}
        window, table, nodes = self.window, self.table, self.nodes
        while True:
            op = table[window.take(1)[0]]  # KeyError: no opcode
            kind = op.kind
            arg = b""
            if op.argument > 0:
                arg = window.take(op.argument)
            elif op.argument == -1:
                arg = b"".join(window.line() for _ in range(op.lines))
            elif op.argument < 0:
                width, signed = _LENGTHS[op.argument]
                length = int.from_bytes(window.take(width), "little", signed=signed)
                if length < 0:
                    raise ValueError("negative length")
                window.skip(length)
            taken: list[Any] = []
            if op.takes:
                taken = stack[-op.takes :]
                if len(taken) != op.takes or _MARK in taken:
                    raise IndexError("stack underflow")
                del stack[-op.takes :]
            if kind == "leaf":
                stack.append(_LEAF)
            elif kind == "get":
                stack.append(memo[int(arg) if op.memo_text else int.from_bytes(arg, "little")])
            elif kind == "put":
                memo[int(arg) if op.memo_text else int.from_bytes(arg, "little")] = stack[-1]
            elif kind == "memoize":
                memo[len(memo)] = stack[-1]
            elif kind == "empty" or kind == "tuple" or kind == "from_mark":
                node = _Node(taken if kind == "tuple" else _after_mark(stack) if kind == "from_mark" else ())
                nodes.append(node)
                stack.append(node)
            elif kind == "mark":
                stack.append(_MARK)
            elif kind == "add" or kind == "into_top":  # an object's state (BUILD) is what it holds too
                self._into_top(stack, taken if kind == "add" else _after_mark(stack))
            elif kind == "call":  # the callable itself is a global: a leaf
                node = _Node(x for arg_ in taken[1:] for x in _held(arg_))
                nodes.append(node)
                stack.append(node)
            elif kind == "swap":
                stack.append(_LEAF)
            elif kind == "pop_mark":
                _after_mark(stack)
            elif kind == "dup":
                stack.append(stack[-1])
            elif kind == "stop":
                return
            # "nothing" and "pop": done

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
    return obj.children if isinstance(obj, _Node) else [obj]


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
            total += 1 if child is _LEAF else self.count(child, depth + 1)
            if total > MAX_OBJECTS:
                raise PickleTooLarge(
                    f"its pickle expands to more than {MAX_OBJECTS:,} objects, shared references counted each time "
                    "they are reached (a pickle bomb?); refused before it was expanded"
                )
            if id(child) in self.counted:
                levels = max(levels, 1 + self.counted[id(child)][1])
        self.open.discard(key)
        self.counted[key] = (total, levels)
        return total


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
