"""A Jupyter kernel for bash, for the code interpreter's language "bash".

Debian packages no bash kernel and E2B's (bash_kernel) is on PyPI only,
so this is one: ipykernel's Kernel class (the messaging protocol) over one
long-lived bash process, whose variables, functions and working directory
last from cell to cell as a terminal's do.

A cell is written to a file and sourced by bash with stdin from /dev/null
(a command that reads stdin gets end of file, not the kernel's protocol).
After it, bash prints a marker with the cell's exit status on stdout and
on stderr; everything before the markers is the cell's output, streamed
as it comes. A non-zero status is the cell's error, as bash_kernel
reports it (ename empty, evalue the status).

An interrupt (SIGINT to the kernel, the kernel spec's interrupt_mode
"signal") is passed to the kernel's process group, which bash and its
commands share: it stops the command bash runs, and bash's trap for it
returns from the sourced cell, so the rest of the cell does not run, as
Ctrl-C in a terminal drops the rest of a command line. The trap ends the
cell even when the signal lands before its command starts (CI: an
interrupt just after "echo looping" and before "sleep" forked was taken
by a trap that only ignored it, and the sleep ran on) and in a loop of
bash's own builtins. The interrupt is sent again each second while the
cell runs (a function returns to its caller, which may go on); a cell
that has not ended within INTERRUPT_GRACE ends with its bash, and a new
bash starts: as a kernel restart, its variables are lost.
"""

import codecs
import os
import queue
import secrets
import signal
import subprocess
import tempfile
import threading
import time

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

# How long an interrupted cell may take to end before its bash is killed.
# 2 s was too short on a loaded machine: TestBashKernel, in the full unit
# run on 2 cores, saw bash killed (its variables gone) after an interrupt
# of a plain sleep. Only a cell that ignores the interrupt (a loop of
# bash's builtins) waits it out.
INTERRUPT_GRACE = 10.0
# How often a running cell looks for an interrupt (relay).
INTERRUPT_POLL = 0.05
# How often an interrupted cell that runs on is interrupted again.
INTERRUPT_AGAIN = 1.0


class BashKernel(Kernel):
    implementation = "sandstorm-bash"
    implementation_version = "1"
    language = "bash"
    language_version = "5"
    language_info = {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh"}
    banner = "bash"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cells = tempfile.mkdtemp(prefix="sandstorm-bash-")
        self.bash = None
        self.start_bash()

    def start_bash(self):
        # The marker: random per bash, so no cell's output can end a cell.
        self.mark = ("\x1esandstorm-%s " % secrets.token_hex(8)).encode()
        self.bash = subprocess.Popen(
            # ipykernel ignores SIGINT outside its handlers, and a shell
            # cannot trap a signal ignored when it starts: env gives bash
            # and its commands the default back.
            ["env", "--default-signal=INT", "bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            bufsize=0, close_fds=True)
        # return: ends the sourced cell at once; between cells (bash
        # reads its next command) it fails, silently, and bash goes on.
        self.send_bash("trap 'return 130 2>/dev/null' INT\n")

    def send_bash(self, text):
        self.bash.stdin.write(text.encode())
        self.bash.stdin.flush()

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False, *, cell_id=None):
        if not code.strip():
            return self.ok()
        cell = os.path.join(self.cells, "cell")
        with open(cell, "w") as f:
            f.write(code + "\n")
        out = queue.Queue()
        readers = [threading.Thread(target=self.read, args=(getattr(self.bash, name), name, out), daemon=True)
                   for name in ("stdout", "stderr")]
        for r in readers:
            r.start()
        mark = "\\036" + self.mark[1:].decode()
        try:
            self.send_bash(". %s </dev/null\nprintf '%s%%d\\n' $?\nprintf '%s0\\n' >&2\n"
                           % (cell, mark, mark))
        except OSError:
            readers = []
        status = self.relay(readers, out, silent)
        if status is None:
            # bash is gone (the cell ran exit) or stuck: a new one.
            self.restart_bash()
            return self.error(silent, "", "bash exited; a new bash was started")
        if status == "interrupted":
            # bash 5.2 leaves SIGCHLD blocked when its trap returns while it
            # waits for a command, and then takes no trap in a loop of its
            # builtins until it waits for a child again (TestBashKernel: a
            # loop after an interrupted sleep ran on). A subshell is one.
            self.send_bash("( : )\n")
            return self.error(silent, "KeyboardInterrupt", "interrupted")
        if status != 0:
            return self.error(silent, "", str(status))
        return self.ok()

    def relay(self, readers, out, silent):
        """Sends the cell's output until both markers arrive; the status,
        "interrupted", or None when bash ended first or would not stop.

        An interrupt only sets a flag here, read between outputs: raised
        as KeyboardInterrupt it could land anywhere, even between taking
        an output and counting its marker, or outside this loop, leaving
        the cell running and a new bash for the next."""
        done, status, grace_end, again = 0, None, None, 0.0
        interrupted = threading.Event()
        old = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
        try:
            while done < len(readers):
                if interrupted.is_set() and time.monotonic() >= again:
                    if grace_end is None:
                        grace_end = time.monotonic() + INTERRUPT_GRACE
                    again = time.monotonic() + INTERRUPT_AGAIN
                    self.interrupt_bash()
                try:
                    item = out.get(timeout=INTERRUPT_POLL)
                except queue.Empty:
                    if grace_end is not None and time.monotonic() > grace_end:
                        self.bash.kill()
                        return None
                    continue
                name, text, end = item
                if end is not None:
                    done += 1
                    if name == "stdout":
                        status = end
                if text and not silent and grace_end is None:
                    self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})
        finally:
            signal.signal(signal.SIGINT, old)
        if len(readers) == 0 or status is None or status < 0:
            return None
        return "interrupted" if interrupted.is_set() else status

    def interrupt_bash(self):
        """Passes the interrupt to bash's command: the server signals the
        kernel's process only, and bash shares its process group."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            os.killpg(os.getpgrp(), signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, old)

    def read(self, pipe, name, out):
        """Puts pipe's output on out as it comes, up to the marker."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        buf = b""
        while True:
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                out.put((name, decoder.decode(buf, final=True), -1))
                return
            buf += chunk
            i = buf.find(self.mark)
            if i >= 0 and buf.find(b"\n", i) >= 0:
                j = buf.find(b"\n", i)
                status = int(buf[i + len(self.mark):j] or b"0")
                out.put((name, decoder.decode(buf[:i], final=True), status))
                return
            # Send all but what may be the start of a marker.
            if i < 0:
                i = buf.rfind(self.mark[:1])
                if i >= 0 and not self.mark.startswith(buf[i:i + len(self.mark)]):
                    i = -1
            cut = len(buf) if i < 0 else i
            if cut > 0:
                out.put((name, decoder.decode(buf[:cut]), None))
                buf = buf[cut:]

    def restart_bash(self):
        try:
            self.bash.kill()
            self.bash.wait(timeout=5)
        except Exception:
            pass
        self.start_bash()

    def ok(self):
        return {"status": "ok", "execution_count": self.execution_count,
                "payload": [], "user_expressions": {}}

    def error(self, silent, ename, evalue):
        content = {"ename": ename, "evalue": evalue, "traceback": []}
        if not silent:
            self.send_response(self.iopub_socket, "error", content)
        content.update(status="error", execution_count=self.execution_count)
        return content

    def do_shutdown(self, restart):
        if self.bash:
            self.bash.kill()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=BashKernel)
