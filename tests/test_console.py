"""The launcher's terminal holds whole lines (launcher/console.py).

The launcher prints its lines from its main thread while a thread per role
echoes that role's output. A role's line once landed inside the launcher's
last summary line (`... summary in /job[worker-1] Traceback ...`): Python's
`sys.stdout` is write-through when it is a pipe, so `print` hands a line's
text and its newline to the buffer in two writes, and the echo thread wrote
between them. Each line must reach the stream's buffer in one write, under
one lock.
"""

import io
import sys

from keras_elastic.launcher import console
from keras_elastic.launcher.backends.base import echo_line
from keras_elastic.launcher.job_log import JobLog


class Recorder(io.RawIOBase):
    """A binary stream that records each write it is handed."""

    def __init__(self):
        self.writes: list[bytes] = []

    def writable(self):
        return True

    def write(self, data):
        self.writes.append(bytes(data))
        return len(data)


def unbuffered_stdout() -> tuple[io.TextIOWrapper, Recorder]:
    raw = Recorder()
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True), raw


def test_a_launcher_line_reaches_the_stream_in_one_write(tmp_path):
    stream, raw = unbuffered_stdout()
    log = JobLog(str(tmp_path))
    summary = "[launcher] ===== job summary =====\n[launcher] logs in /job"
    log.say(summary, stream)
    log.close()
    assert raw.writes == [summary.encode() + b"\n"]
    # The file beside it holds the same lines.
    assert summary in (tmp_path / "launcher.log").read_text()


def test_a_role_line_reaches_the_stream_in_one_write(monkeypatch):
    stream, raw = unbuffered_stdout()
    monkeypatch.setattr(sys, "stdout", stream)
    echo_line(b"[worker-1] ", b"Traceback (most recent call last):\n")
    echo_line(b"[worker-1] ", b"epoch 1/2\r 3/16\r16/16 - 1s\n")  # a progress bar
    assert raw.writes == [b"[worker-1] Traceback (most recent call last):\n",
                          b"[worker-1] 16/16 - 1s\n"]


def test_text_written_before_a_line_stays_before_it():
    buffered = Recorder()
    stream = io.TextIOWrapper(buffered, encoding="utf-8")  # not write-through
    stream.write("earlier\n")
    console.write_line("[launcher] later", stream)
    assert b"".join(buffered.writes) == b"earlier\n[launcher] later\n"


def test_a_text_only_stream_gets_the_line_as_text():
    stream = io.StringIO()
    console.write_line(b"[ps-0] serving", stream)
    console.write_line("[launcher] done", stream)
    assert stream.getvalue() == "[ps-0] serving\n[launcher] done\n"
