"""Progress, cancel, exceptions from the callback, and the GIL released during loads."""

import sys
import threading
import time

import pytest

import tensora
from tensora import _native
from conftest import collect


@pytest.mark.parametrize("residence", ["auto", "owned", "mapped"])
def test_progress_reports_up_to_the_total(big_file, residence):
    calls = []
    d = tensora.load_file(big_file, residence=residence, progress=lambda done, total: calls.append((done, total)))
    total = sum(a.nbytes for a in d.values())
    assert calls, "called at least once"
    assert calls[-1] == (total, total)
    assert all(t == total for _, t in calls)
    assert [c for c, _ in calls] == sorted(c for c, _ in calls)


@pytest.mark.parametrize("residence", ["auto", "owned", "mapped"])
def test_returning_false_cancels_and_frees(big_file, residence):
    collect()
    base = _native.owners_live()
    calls = []

    def stop(done, total):
        calls.append(done)
        return False

    with pytest.raises(tensora.CancelledError, match="returned False"):
        tensora.load_file(big_file, residence=residence, progress=stop)
    assert len(calls) == 1, "never called again after cancelling"
    collect()
    assert _native.owners_live() == base
    with pytest.raises(tensora.CancelledError):
        tensora.hash(big_file, progress=lambda done, total: False)


def test_returning_none_or_true_continues(big_file):
    assert len(tensora.load_file(big_file, progress=lambda d, t: None)) == 24
    assert len(tensora.load_file(big_file, progress=lambda d, t: True)) == 24


class Boom(Exception):
    pass


def test_callback_exception_propagates_unchanged(big_file):
    raised = Boom("from the callback")

    def cb(done, total):
        raise raised

    with pytest.raises(Boom) as e:
        tensora.load_file(big_file, progress=cb)
    assert e.value is raised
    with pytest.raises(Boom):
        tensora.hash(big_file, progress=cb)


def test_keyboard_interrupt_propagates(big_file):
    def cb(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tensora.load_file(big_file, progress=cb)


def _counter_runs_during(fn) -> int:
    """How often another Python thread ran while `fn` ran, with thread switching by the
    interpreter made rare (10 s), so only released-GIL waits let it run."""
    count = 0
    stop = False

    def spin():
        nonlocal count
        while not stop:
            count += 1
            time.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    t = threading.Thread(target=spin)
    try:
        t.start()
        time.sleep(0.01)  # let it start (sleep releases the GIL)
        before = count
        fn()
        during = count - before
    finally:
        stop = True
        sys.setswitchinterval(old)
        t.join()
    return during


def test_other_threads_run_during_a_load(big_file):
    assert _counter_runs_during(lambda: tensora.load_file(big_file)) > 0


def test_other_threads_run_during_streaming(big_file):
    assert _counter_runs_during(lambda: list(tensora.weights_iterator(big_file, framework="np"))) > 0


def test_a_pure_python_loop_does_not_let_the_thread_run():
    # The control for the two tests above: with a 10 s switch interval, a GIL-holding busy loop
    # of similar length lets the other thread run at most at its start.
    def busy():
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass

    assert _counter_runs_during(busy) <= 1


class Interrupted(Exception):
    pass


# Bound on the helper's look-ups of the main thread's frame (1 ms apart) before it gives up.
FRAME_POLLS_MAX = 10_000


def test_a_signal_during_a_load_cancels_it(big_file):
    """A signal that arrives during a load is observed by the load itself, which stops, frees its
    memory and raises the handler's exception with its cancellation note.

    The order is forced, so nothing but the load can observe the signal: the progress callback is
    a C function (`RLock.acquire`) that blocks the main thread inside the load until a helper
    thread has sent the signal (to itself: the main thread blocks it, so its C-level handler runs
    on the helper and only marks it pending). From then until the load's next poll the main
    thread runs no Python code, so the handler runs inside the load's signal check. A load that
    ignored signals would return, and the handler would run afterwards without the note.
    """
    import dis
    import signal

    assert threading.current_thread() is threading.main_thread()
    sig = signal.SIGUSR1
    gate = threading.RLock()
    native_load = _native.load
    path = str(big_file)

    def run_load():
        # `gate.acquire(done, total)`: blocking, with `total` seconds as the timeout.
        return native_load(path, None, "auto", gate.acquire, "owned")

    call_at = [i.offset for i in dis.get_instructions(run_load) if i.opname in ("CALL", "CALL_FUNCTION")][-1]
    main_id = threading.get_ident()
    holding = threading.Event()
    outcome = []

    def helper():
        gate.acquire()
        holding.set()
        try:
            for _ in range(FRAME_POLLS_MAX):
                frame = sys._current_frames().get(main_id)
                if frame is not None and frame.f_code is run_load.__code__ and frame.f_lasti == call_at:
                    signal.pthread_kill(threading.get_ident(), sig)
                    outcome.append("sent")
                    return
                time.sleep(0.001)
            outcome.append("the main thread never entered the load")
        finally:
            gate.release()

    def handler(signum, frame):
        raise Interrupted

    collect()
    base = _native.owners_live()
    old = signal.signal(sig, handler)
    t = threading.Thread(target=helper)  # created before the mask: it keeps the signal unblocked
    t.start()
    assert holding.wait(10), "the helper never took the gate"
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    try:
        with pytest.raises(Interrupted) as e:
            run_load()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        t.join()
        signal.signal(sig, old)
    assert outcome == ["sent"], outcome
    assert any("the load was cancelled" in n for n in getattr(e.value, "__notes__", [])), (
        "the handler ran after the load returned, not inside it"
    )
    collect()
    assert _native.owners_live() == base
