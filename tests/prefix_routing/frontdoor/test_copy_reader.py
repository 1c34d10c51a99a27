"""The copy reader (prefix_routing/frontdoor/copies.py) with a plain fake client: one reading per
interval (due again exactly an interval after the last try), failures backed off the same way and
never raised, the component named, and only an integer kept as the current copy count."""

from __future__ import annotations

from prefix_routing.frontdoor.copies import CopyCounts


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class SageMaker:
    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def describe_inference_component(self, **kwargs):
        self.asked.append(kwargs)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def runtime(desired, current) -> dict:
    return {"InferenceComponentName": "ic", "RuntimeConfig": {"DesiredCopyCount": desired, "CurrentCopyCount": current}}


def test_a_reading_is_due_exactly_one_interval_after_the_last():
    client, clock = SageMaker(runtime(3, 2), runtime(4, 3)), Clock(100.0)
    copies = CopyCounts(lambda: client, "ic", interval_s=60.0, clock=clock)
    assert copies.sample() == (3, 2)
    clock.now = 159.75
    assert copies.sample() is None
    clock.now = 160.0
    assert copies.sample() == (4, 3)
    assert client.asked == [{"InferenceComponentName": "ic"}] * 2


def test_the_default_interval_is_a_minute():
    client, clock = SageMaker(runtime(1, 1), runtime(2, 2)), Clock(0.0)
    copies = CopyCounts(lambda: client, "ic", clock=clock)
    copies.sample()
    clock.now = 59.5
    assert copies.sample() is None
    clock.now = 60.0
    assert copies.sample() == (2, 2)


def test_a_failure_is_named_backed_off_and_cleared_by_the_next_reading():
    client, clock = SageMaker(PermissionError("denied"), runtime(2, 2)), Clock(100.0)
    copies = CopyCounts(lambda: client, "ic", interval_s=30.0, clock=clock)
    assert copies.sample() is None and copies.last_error == "PermissionError"
    clock.now = 129.5
    assert copies.sample() is None and len(client.asked) == 1  # not tried again within the interval
    clock.now = 130.0
    assert copies.sample() == (2, 2) and copies.last_error is None and copies.current == 2


def test_a_client_that_cannot_be_made_is_a_failure_tried_again_later():
    made, clock = [], Clock(0.0)
    client = SageMaker(runtime(5, 4))

    def factory():
        made.append(clock.now)
        if len(made) == 1:
            raise OSError("no credentials")
        return client

    copies = CopyCounts(factory, "ic", interval_s=10.0, clock=clock)
    assert copies.sample() is None and copies.last_error == "OSError"
    clock.now = 10.0
    assert copies.sample() == (5, 4)
    clock.now = 20.0
    client.answers.append(runtime(5, 5))
    assert copies.sample() == (5, 5) and made == [0.0, 10.0]  # made once it worked, then kept


def test_only_an_integer_is_kept_as_the_current_count():
    client = SageMaker(runtime(3, 2), runtime(3, True), runtime(3, None), {"InferenceComponentName": "ic"},
                       {"RuntimeConfig": None}, runtime(3, "4"))
    clock = Clock(0.0)
    copies = CopyCounts(lambda: client, "ic", interval_s=1.0, clock=clock)
    seen = []
    for t in range(6):
        clock.now = float(t)
        seen.append((copies.sample(), copies.current))
    assert seen == [((3, 2), 2), ((3, True), 2), ((3, None), 2), ((None, None), 2), ((None, None), 2),
                    ((3, "4"), 2)]
