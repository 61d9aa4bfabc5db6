"""vipu-server stops on SIGTERM whichever of its threads the kernel hands the signal to, and a
SIGTERM during start-up aborts the start."""

import signal
import subprocess
import sys
import textwrap

import pytest

STOPPED_BY_ANOTHER_THREADS_SIGNAL = textwrap.dedent("""
    import signal, sys, threading, time
    from vipu.controller.main import Stopping

    def blocked_in_wait(main):
        with open(f"/proc/self/task/{main.native_id}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        return state == "S" and sys._current_frames()[main.ident].f_code.co_name == "wait"

    def signal_this_thread_once_the_main_one_waits():
        main, deadline = threading.main_thread(), time.monotonic() + 10
        while not blocked_in_wait(main) and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    stopping = Stopping()
    stopping.serving = True
    threading.Thread(target=signal_this_thread_once_the_main_one_waits).start()
    stopping.wait()
    print("stopped")
""")

ABORTED_START = textwrap.dedent("""
    import signal
    from vipu.controller.main import Stopping

    Stopping()
    try:
        signal.raise_signal(signal.SIGTERM)  # as if it came while the controller was starting
    finally:
        print("cleaned up")
""")


def test_a_sigterm_received_by_another_thread_stops_the_wait():
    try:
        done = subprocess.run([sys.executable, "-c", STOPPED_BY_ANOTHER_THREADS_SIGNAL],
                              capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the main thread went on waiting after another thread received SIGTERM")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_a_sigterm_during_start_up_aborts_it_through_the_clean_up():
    done = subprocess.run([sys.executable, "-c", ABORTED_START], capture_output=True, text=True, timeout=15)
    assert (done.returncode, done.stdout.strip()) == (128 + signal.SIGTERM, "cleaned up")
