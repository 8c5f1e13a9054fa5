"""slot_maker: the fast constructor gives the same objects as the dataclass's own __init__."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.graph.events import EventsLost, PollEnter, PollExit
from proxy.graph.fast import slot_maker
from proxy.graph.model import PollScope

CASES = [
    (PollEnter, (7, 1234, 0x5000, 0x7FFF0000, 0x7FFE0000, 0x5555, 3, 99, (0x10, 0x5000))),
    (PollEnter, (8, 1, 0x5000, 0x10, 0x20, None, None, None, None)),
    (PollExit, (9, 1234, 0x5000, 0x7FFE0000, 1, 0x7FFF0000, None, False, 100)),
    (EventsLost, (10, 3, "ring full")),
]


@pytest.mark.parametrize("cls,args", CASES)
def test_same_object_as_the_dataclass_init(cls: type, args: tuple[object, ...]) -> None:
    made = slot_maker(cls)(*args)
    ref = cls(*args)
    assert type(made) is cls
    assert made == ref and hash(made) == hash(ref) and repr(made) == repr(ref)
    assert dataclasses.astuple(made) == args
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, 0)  # still frozen


def test_every_field_must_be_given() -> None:
    with pytest.raises(TypeError):
        slot_maker(PollExit)(1, 2, 3)


def test_a_scope_built_as_the_engine_does_is_the_named_tuple() -> None:
    """state.py builds its scopes with tuple.__new__ (the cheapest way)."""
    made = tuple.__new__(PollScope, (1234, 4, 0x5000, 0x7FFE0000, 7, 99, True))
    ref = PollScope(1234, 4, 0x5000, 0x7FFE0000, 7, 99, True)
    assert type(made) is PollScope and made == ref and repr(made) == repr(ref) and made.nested is True
    assert PollScope(1, 2, 3, 4, 5) == (1, 2, 3, 4, 5, None, False)
    with pytest.raises(AttributeError):
        made.sp = 0  # type: ignore[misc]
