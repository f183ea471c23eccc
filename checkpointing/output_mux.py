"""Whole output lines, each labelled with where it came from, for a job with several training processes.

The launcher (:mod:`dlsub.checkpointing.launch`) owns one :class:`OutputMux`
per container. Each training process hands it its stdout and stderr as one
pipe (:mod:`dlsub.checkpointing.rank_output`, torchrun's entry point), with
its global rank; torchrun's own stdout and stderr are one more. The mux
reads them all in one thread, cuts whole lines, puts the label in front
(``[rank]:``, ``[node/rank]:``, ``[dlsub]:`` for the launcher and torchrun:
:data:`dlsub.contract.OUTPUT_LABEL`) and is the only writer of the
container's stdout, one ``write`` per batch of whole lines.

Why not torchrun's ``--tee`` with ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``
(tried first; torch 2.13): its labels are right (``${rank}`` is the global
rank) but its lines are not whole. It redirects each rank to a file and a
thread per rank copies ``readline()`` results every 0.1 s; ``readline`` at the
end of a growing file returns the part written so far, so a line written in
pieces (Python's ``print`` writes each argument, separator and the newline
apart when unbuffered, as torchrun runs scripts) comes out cut, another
rank's line in between (9 of 12,000 lines in a 4-rank test here); a partial
last line gets no newline, so the next rank's line is glued to it; and the
copies sit in torchrun's block-buffered stdout, so ``dlsub logs -f`` lags.
It also keeps a second copy of all output in the container's /tmp.

What we keep from torchrun's format: the labels, and ``\\r`` ends a line as
``\\n`` does (its text-mode ``readline``): a progress bar redrawn with ``\\r``
becomes one labelled line per redraw instead of one unbounded line.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import stat
import tempfile
import threading
import time

from dlsub.contract import LAUNCHER_SOURCE, OUTPUT_GANG_LABEL, OUTPUT_LABEL

#: The longest line written to a regular file (the Slurm output file, one node): longer ones are cut into
#: pieces of this size, each labelled. Bounds what one stream may hold while it waits for a newline.
FILE_LINE_MAX = 64 * 1024
#: The longest line written to anything else (a gang's node writes into srun's pipe): slurmstepd sends a
#: task's output to srun in messages of at most 1024 bytes (Slurm's SLURM_IO_MAX_MSG_LEN), a whole line each
#: when it fits; a longer line is cut there and another node's lines may land between its pieces. Below
#: that, with the newline and a margin, every piece arrives whole.
PIPE_LINE_MAX = 1000
#: Most bytes one read takes from a stream, and one write hands on.
_CHUNK = 64 * 1024
#: The handover message of a training process: JSON ``{"rank": N}``, at most this long, with 1 fd.
HELLO_MAX = 64
MAX_RANK = 9_999_999


def line_limit(fd: int) -> int:
    """How long a written line may be on ``fd`` (see FILE_LINE_MAX, PIPE_LINE_MAX)."""
    try:
        return FILE_LINE_MAX if stat.S_ISREG(os.fstat(fd).st_mode) else PIPE_LINE_MAX
    except OSError:
        return PIPE_LINE_MAX


class LineSplitter:
    """Bytes in, whole lines out (without their end): lines end at ``\\n``, ``\\r\\n`` or ``\\r``.

    A line of more than ``limit`` bytes comes out in pieces of at most
    ``limit``, cut between UTF-8 characters where possible. An empty line
    ended by ``\\r`` alone (a progress bar's redraw) is dropped.
    """

    def __init__(self, limit: int) -> None:
        if limit < 8:
            raise ValueError(f"line limit {limit} is too small")
        self.limit = limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        start = 0
        buf = self._buf
        nl = cr = -2  # -2: look again; -1: none left in this buffer
        while True:
            if -1 != nl < start:
                nl = buf.find(b"\n", start)
            if -1 != cr < start:
                cr = buf.find(b"\r", start)
            end = min(nl, cr) if nl >= 0 and cr >= 0 else max(nl, cr)
            if end < 0 or end - start > self.limit:
                if len(buf) - start <= self.limit:
                    break
                cut = _utf8_cut(buf, start, start + self.limit)
                lines.append(bytes(buf[start:cut]))
                start = cut
                continue
            if end == cr:
                if cr + 1 == len(buf):
                    break  # a \n may follow in the next read: wait for it
                skip = 2 if buf[cr + 1:cr + 2] == b"\n" else 1
                if skip == 2 or cr > start:
                    lines.append(bytes(buf[start:cr]))
                start = cr + skip
            else:
                lines.append(bytes(buf[start:nl]))
                start = nl + 1
        del buf[:start]
        return lines

    def flush(self) -> list[bytes]:
        """What is left (a partial last line, its writer gone), as a line; a lone ``\\r`` ends it."""
        rest = bytes(self._buf).rstrip(b"\r")
        self._buf.clear()
        return [rest] if rest else []


def _utf8_cut(buf: bytearray, start: int, end: int) -> int:
    """``end``, moved back (at most 3 bytes) so as not to split a UTF-8 character."""
    cut = end
    while cut > start + 1 and end - cut < 3 and buf[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut if buf[cut] & 0xC0 != 0x80 else end


class _Stream:
    def __init__(self, label: bytes, limit: int) -> None:
        self.label = label
        self.splitter = LineSplitter(max(8, limit - len(label) - 1))


class OutputMux:
    """One container's labelled output: training processes' pipes, torchrun's, and the launcher's lines.

    ``node`` is the node's name for a gang's labels (``[node/rank]:``),
    None on one node (``[rank]:``). Start it with :meth:`start`, give
    torchrun :attr:`child_output` (its stdout and stderr) and
    ``$DLSUB_OUTPUT_SOCKET=`` :attr:`socket_path`, end it with :meth:`close`.
    """

    def __init__(self, out_fd: int = 1, node: str | None = None) -> None:
        self.out_fd = out_fd
        self.node = node
        self.limit = line_limit(out_fd)
        self._lock = threading.Lock()  # the writer: the mux thread and the launcher's own lines
        self._dir = tempfile.mkdtemp(prefix="dlsub-output-")  # mode 0700: this user's processes only
        self.socket_path = os.path.join(self._dir, "socket")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.socket_path)
        self._listener.listen(64)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._streams: dict[int, _Stream] = {}
        # torchrun's own output: the write end stays open here across torchrun runs (an elastic group
        # re-forms by starting it again) and is closed by close().
        self.child_output = self._add_pipe(self.label(LAUNCHER_SOURCE))
        self._closing = False
        self._abandon = False
        self._thread = threading.Thread(target=self._loop, name="dlsub-output", daemon=True)

    def start(self) -> OutputMux:
        self._thread.start()
        return self

    def label(self, source: int | str) -> bytes:
        text = OUTPUT_GANG_LABEL.format(node=self.node, source=source) if self.node \
            else OUTPUT_LABEL.format(source=source)
        return text.encode()

    def log(self, message: str) -> None:
        """One of the launcher's own messages, labelled as dlsub's."""
        stream = _Stream(self.label(LAUNCHER_SOURCE), self.limit)
        lines = stream.splitter.feed(message.encode("utf-8", "replace") + b"\n") + stream.splitter.flush()
        self._write(stream.label, lines)

    def close(self, drain_s: float = 5.0) -> None:
        """Stop once every stream has ended, or after ``drain_s`` (a process that outlives the training
        may hold a pipe open): partial last lines are written, with a newline."""
        os.close(self.child_output)
        self._closing = True
        if not self._thread.is_alive():
            self._finish()
        else:
            os.write(self._wake_w, b"x")
            self._thread.join(drain_s)
            self._abandon = True
            os.write(self._wake_w, b"x")
            self._thread.join(drain_s)
            if self._thread.is_alive():
                return  # stuck writing to an output nobody reads: the process ends anyway
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------ the mux thread
    def _add_pipe(self, label: bytes) -> int:
        read_end, write_end = os.pipe()
        self._register(read_end, label)
        return write_end

    def _register(self, fd: int, label: bytes) -> None:
        self._streams[fd] = _Stream(label, self.limit)
        self._selector.register(fd, selectors.EVENT_READ, None)

    def _loop(self) -> None:
        try:
            while not self._abandon and not (self._closing and not self._streams):
                for key, _ in self._selector.select(timeout=1.0):
                    if key.fd == self._wake_r:
                        os.read(self._wake_r, 64)
                    elif key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.fd)
        finally:
            self._finish()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(1.0)  # only our entry point connects; a silent peer costs a second at most
            fds: list[int] = []
            try:
                message, fds, _, _ = socket.recv_fds(conn, HELLO_MAX, 1, socket.MSG_CMSG_CLOEXEC)
                rank = json.loads(message.decode()).get("rank") if message else None
                if not (len(fds) == 1 and type(rank) is int and 0 <= rank <= MAX_RANK):
                    raise ValueError("not a training process's handover")
                for fd in fds:
                    self._register(fd, self.label(rank))
                fds = []
                conn.sendall(b"k")
            except (OSError, ValueError, AttributeError):
                pass
            finally:
                for fd in fds:
                    os.close(fd)

    def _read(self, fd: int) -> None:
        stream = self._streams[fd]
        try:
            data = os.read(fd, _CHUNK)
        except OSError:
            data = b""
        if data:
            self._write(stream.label, stream.splitter.feed(data))
            return
        # Every writer of this pipe is gone (the process ended, its children too).
        self._write(stream.label, stream.splitter.flush())
        self._selector.unregister(fd)
        os.close(fd)
        del self._streams[fd]

    def _finish(self) -> None:
        for fd in list(self._streams):
            stream = self._streams.pop(fd)
            self._write(stream.label, stream.splitter.flush())
            os.close(fd)
        self._selector.close()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _write(self, label: bytes, lines: list[bytes]) -> None:
        """Whole lines only in each ``write``: the batch script appends to the same file now and then."""
        batch: list[bytes] = []
        size = 0
        for line in lines:
            item = label + line + b"\n"
            if batch and size + len(item) > _CHUNK:
                self._write_all(b"".join(batch))
                batch, size = [], 0
            batch.append(item)
            size += len(item)
        if batch:
            self._write_all(b"".join(batch))

    def _write_all(self, data: bytes) -> None:
        with self._lock:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.out_fd, view):]
                except InterruptedError:
                    continue
                except BlockingIOError:
                    time.sleep(0.01)
                except OSError:
                    return  # nowhere to write (the output is gone): the training must not block on us
