"""Worker processes that end with the ``streamfl sim`` that started them, however it ends."""
import os
import threading
import time

#: How often a worker checks that the ``streamfl sim`` that started it is still there.
PARENT_POLL_S = 1.0
#: The watching thread's name (a thread that holds no lock, so a fork beside it is safe).
WATCH_THREAD_NAME = "exit-with-parent"


def exit_with_parent(parent_pid: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """End this process once ``parent_pid`` is gone: a ``streamfl sim`` killed by a signal runs no
    clean-up, and its workers would otherwise go on computing their runs for an hour, orphaned."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)  # the parent is gone: nobody will read this run's result

    thread = threading.Thread(target=watch, name=WATCH_THREAD_NAME, daemon=True)
    thread.start()
    return thread
