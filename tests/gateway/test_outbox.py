"""The pipeline connection's compiled outbound queue (gateway/_outbox.pyx), on its own: order,
byte accounting, backpressure, the wake-up, and the coalescing read. No server."""
import threading

from tryll_fast import codec
from tryll_fast.gateway._outbox import Outbox


def answer(rid: int, text: str) -> bytes:
    return codec.encode(codec.AnswerText(request_id=rid, agent_id=1, node_name="n", text=text,
                                         is_delta=True))


class Wakes:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1


def test_items_leave_in_order_and_one_wake_per_burst():
    wakes = Wakes()
    box = Outbox(1 << 20, 1 << 10, wakes)
    frames = [answer(1, f"t{i} ") for i in range(5)]
    for f in frames:
        assert box.send(f)
    assert wakes.n == 1 and len(box) == 5
    assert box.queued == sum(len(f) for f in frames)
    box.woken()
    assert box.put(("other",), 0) and wakes.n == 2
    got = [box.take() for _ in range(6)]
    assert got == frames + [("other",)] and box.take() is None and box.head() is None
    for f in frames:
        box.release(len(f))
    assert box.queued == 0


def test_pause_at_the_high_mark_resume_at_the_low_one():
    box = Outbox(100, 40, Wakes())
    frame = b"x" * 30
    for _ in range(3):
        box.send(frame)
    assert not box.paused
    box.send(frame)
    assert box.paused and box.paused_at > 0
    waited = threading.Event()

    def producer():
        box.wait_writable(10)
        waited.set()

    t = threading.Thread(target=producer)
    t.start()
    assert not waited.wait(0.05)
    box.take()
    assert not box.release(30)                  # 90 bytes left: still above the low mark
    box.take()
    assert box.release(30) is False and box.paused
    box.take()
    assert box.release(30) is True and not box.paused     # 30 <= 40: resumed
    assert waited.wait(5)
    t.join()


def test_shut_refuses_except_the_connections_own_goodbye():
    box = Outbox(1 << 20, 1 << 10, Wakes())
    box.shut = True
    assert not box.send(b"late")
    assert box.put(("close",), 0, True)
    assert box.take() == ("close",) and box.take() is None
    box.send  # noqa: B018 - still a callable after shutting
    box.clear()
    assert box.queued == 0 and not box.paused


def test_take_text_run_joins_the_same_requests_queued_text():
    box = Outbox(1 << 20, 1 << 10, Wakes())
    first = answer(7, "a")
    rest = [answer(7, "b"), answer(7, "c"), answer(7, ""), answer(7, "d")]
    for f in [first, *rest, answer(8, "x")]:
        box.send(f)
    assert box.take() == first
    box.release(len(first))
    text, resumed = box.take_text_run(7, "a", 16384)
    assert (text, resumed) == ("abc", False)           # stops at the empty terminator
    assert box.take() == rest[2]
    box.release(len(rest[2]))
    assert box.take_text_run(7, "", 16384)[0] == "d"   # and at another request's frame
    assert box.head() == answer(8, "x")
    assert box.queued == len(answer(8, "x"))


def test_take_text_run_stops_at_the_character_cap_and_at_other_items():
    box = Outbox(1 << 20, 1 << 10, Wakes())
    for _ in range(10):
        box.send(answer(1, "xxxx"))
    text, _ = box.take_text_run(1, "", 10)
    assert text == "xxxx" * 3 and len(box) == 7
    box.put(("speech",), 0)
    box2 = Outbox(1 << 20, 1 << 10, Wakes())
    box2.put(("speech",), 0)
    box2.send(answer(1, "y"))
    assert box2.take_text_run(1, "z", 100) == ("z", False)


def test_take_text_run_resumes_a_paused_queue():
    frame = answer(3, "token ")
    box = Outbox(len(frame) * 4, len(frame), Wakes())
    for _ in range(4):
        box.send(frame)
    assert box.paused
    box.take()
    box.release(len(frame))
    text, resumed = box.take_text_run(3, "token ", 16384)
    assert text == "token " * 4 and resumed and not box.paused and box.queued == 0


def test_producers_and_a_consumer_account_every_byte():
    box = Outbox(1 << 30, 1 << 20, Wakes())
    frame = answer(1, "t ")
    n, producers = 20_000, 3
    done = threading.Event()
    taken = [0]

    def consume():
        while not (done.is_set() and box.head() is None):
            item = box.take()
            if item is None:
                box.woken()
                continue
            box.release(len(item))
            taken[0] += 1

    def produce():
        for _ in range(n):
            box.send(frame)

    c = threading.Thread(target=consume)
    c.start()
    ps = [threading.Thread(target=produce) for _ in range(producers)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    done.set()
    c.join(30)
    assert taken[0] == n * producers and box.queued == 0 and len(box) == 0
