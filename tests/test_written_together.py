"""safe_io.written_together: a stop (Ctrl-C, SIGTERM) that arrives while a report's files are written takes effect
after the last of them; a second stop takes effect at once; the handlers in place before are put back."""

import signal
import threading

import pytest

from seqdiff.safe_io import written_together


def test_ctrl_c_during_the_block_is_raised_when_it_ends():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with written_together():
            signal.raise_signal(signal.SIGINT)
            done.append("after the signal")  # still runs: the stop waits for the block's end
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_stops_at_once_and_only_once():
    done = []
    with pytest.raises(KeyboardInterrupt) as caught:
        with written_together():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            done.append("never")
    assert done == []
    assert caught.value.__context__ is None  # one KeyboardInterrupt, not a second one raised over it


def test_sigterm_reaches_the_previous_handler_after_the_block():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with written_together():
            signal.raise_signal(signal.SIGTERM)
            assert seen == []  # held
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_no_signal_no_change():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with written_together():
        pass
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_outside_the_main_thread_the_block_just_runs():
    """signal.signal raises ValueError outside the main thread; the block must not try."""
    errors, done = [], []

    def body():
        try:
            with written_together():
                done.append(True)
        except Exception as e:  # noqa: BLE001 (the test reports it)
            errors.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert done == [True] and errors == []
