"""The renewal of the stream leases held in one execution environment: when each is renewed, with
what expiry, what a failed or refused renewal does, and the thread that does it in the background.
Expected values are hand computations from lease_renewal.py's docstring (a lease of 30 s is renewed
every 10 s, each renewal writing now + 30)."""

from __future__ import annotations

import threading
import time

import pytest

from prefix_routing.frontdoor.lease_renewal import MAX_HELD, LeaseRenewer


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Table:
    """What the renewals wrote: (tenant, lease, expiry); ``answers`` in turn (an exception is raised)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.writes: list[tuple] = []

    def __call__(self, tenant: str, lease: str, expires_s: float) -> bool:
        self.writes.append((tenant, lease, expires_s))
        answer = self.answers.pop(0) if self.answers else True
        if isinstance(answer, Exception):
            raise answer
        return answer


def renewer(table, clock, lease_s=30) -> LeaseRenewer:
    return LeaseRenewer(table, lease_s, clock=clock, background=False)


def test_a_held_lease_is_renewed_every_third_of_the_lease_to_now_plus_the_lease():
    clock, table = Clock(), Table()
    keeper = renewer(table, clock)
    keeper.hold("acme", "l1")
    clock.now = 1009.999
    assert keeper.renew_due() == 0 and table.writes == []  # not yet: due at 1,010
    clock.now = 1010.0
    assert keeper.renew_due() == 1 and table.writes == [("acme", "l1", 1040.0)]
    clock.now = 1015.0
    assert keeper.renew_due() == 0  # the next is due at 1,020
    clock.now = 1020.5
    assert keeper.renew_due() == 1 and table.writes[-1] == ("acme", "l1", 1050.5)
    assert (keeper.renewed, keeper.failed, keeper.held) == (2, 0, 1)


def test_each_lease_keeps_its_own_schedule_and_a_dropped_one_is_not_renewed():
    clock, table = Clock(), Table()
    keeper = renewer(table, clock)
    keeper.hold("acme", "l1")
    clock.now = 1004.0
    keeper.hold("beta", "l2")
    keeper.hold("acme", "l3")
    keeper.drop("l3")
    keeper.drop("never-held")  # nothing to drop: nothing happens
    clock.now = 1010.0
    assert keeper.renew_due() == 1 and table.writes == [("acme", "l1", 1040.0)]
    clock.now = 1014.0
    assert keeper.renew_due() == 1 and table.writes[-1] == ("beta", "l2", 1044.0)
    assert keeper.held == 2


def test_a_failed_renewal_is_tried_again_a_third_later_before_the_lease_ends():
    clock, table = Clock(), Table(RuntimeError("the store is frozen"), True)
    keeper = renewer(table, clock)
    keeper.hold("acme", "l1")
    clock.now = 1010.0
    assert keeper.renew_due() == 1 and (keeper.renewed, keeper.failed, keeper.held) == (0, 1, 1)
    clock.now = 1020.0  # the lease, written at 1,000, lasts until 1,030: this try is in time
    assert keeper.renew_due() == 1 and table.writes[-1] == ("acme", "l1", 1050.0)
    assert (keeper.renewed, keeper.failed) == (1, 1)


def test_a_lease_the_table_no_longer_holds_is_dropped():
    clock, table = Clock(), Table(False)
    keeper = renewer(table, clock)
    keeper.hold("acme", "l1")
    clock.now = 1010.0
    keeper.renew_due()
    assert keeper.held == 0
    clock.now = 1020.0
    assert keeper.renew_due() == 0 and len(table.writes) == 1


def test_the_leases_held_are_bounded():
    keeper = renewer(Table(), Clock())
    for i in range(MAX_HELD + 5):
        keeper.hold("acme", f"l{i}")
    assert keeper.held == MAX_HELD


def test_in_the_background_a_thread_renews_while_leases_are_held_and_stops_when_none_are():
    renewed = threading.Event()
    writes = []

    def table(tenant, lease, expires_s):
        writes.append((tenant, lease))
        renewed.set()
        return True

    keeper = LeaseRenewer(table, 0.3, clock=time.time)  # renewed every 0.1 s
    keeper.hold("acme", "l1")
    assert renewed.wait(5.0), "no renewal within 5 s"
    keeper.drop("l1")
    deadline = time.monotonic() + 5.0
    while keeper._thread is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert keeper._thread is None  # nothing held: the thread ended
    count = len(writes)
    time.sleep(0.3)
    assert len(writes) == count
    renewed.clear()
    keeper.hold("acme", "l2")  # a new hold starts a thread again
    assert renewed.wait(5.0) and writes[-1] == ("acme", "l2")
    keeper.drop("l2")


@pytest.mark.parametrize("lease_s", [10, 30, 60])
def test_three_renewals_fit_in_every_lease(lease_s):
    keeper = renewer(Table(), Clock(), lease_s)
    assert keeper.interval_s * 3 == pytest.approx(lease_s)
