"""``FakeAdmission``: the admission slots :meth:`FakeEngineClient.admit <asyncdp.testing.FakeEngineClient.admit>`
reserves for one HTTP request, as the real client's ``ClientAdmission``: each ``generate(..., admission=)`` takes
one, and ``release`` gives back the ones no sequence took (its owner's count of reserved slots goes down with them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncdp.testing.fake_client import FakeEngineClient


class FakeAdmission:
    """Slots ``FakeEngineClient.admit`` reserved; each ``generate(..., admission=)`` takes one."""

    def __init__(self, owner: FakeEngineClient, num_slots: int) -> None:
        self.owner = owner
        self.num_left = num_slots

    def take(self) -> bool:
        if self.num_left == 0:
            return False
        self.num_left -= 1
        self.owner._num_reserved -= 1
        return True

    def release(self) -> None:
        if self.num_left:
            self.owner._num_reserved -= self.num_left
            self.num_left = 0
            self.owner._notify()
