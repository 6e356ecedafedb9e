"""Runs a command in a pseudo-terminal of a given size and records what it
draws (run by scripts/gpu_tour.py to picture `vramcap top`).

  pty_capture.py COLS ROWS SECONDS OUTFILE -- CMD [ARGS...]

Everything the command writes in the first SECONDS is saved to OUTFILE as
raw bytes (escape sequences included; scripts/render-terminal.py turns them
into a picture); then "q" is typed and the command's exit status is this
script's.
"""

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time


def main() -> int:
    cols, rows, seconds, outfile = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.execvp(cmd[0], cmd)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    data = bytearray()
    end = time.time() + seconds
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    with open(outfile, "wb") as f:
        f.write(data)
    os.write(fd, b"q")
    deadline = time.time() + 10
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        try:
            select.select([fd], [], [], 0.1)
            os.read(fd, 65536)
        except OSError:
            pass
    os.kill(pid, 9)
    return 1


if __name__ == "__main__":
    sys.exit(main())
