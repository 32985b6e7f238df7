"""A Jupyter kernel for JavaScript and TypeScript, for the code
interpreter's languages "javascript" and "typescript".

Debian packages no JavaScript kernel, and E2B's (its fork of ijavascript)
is installed from GitHub, which this machine cannot reach; npm's tslab
runs here but shows a cell's value as printed output, not as its result.
So this is one: the bash kernel's frame (bashkernel.py: ipykernel's
Kernel class, a child process, output relayed up to a marker, interrupts
passed to the process group) over one long-lived Node.js process running
jsrunner.js, whose globals last from cell to cell.

A cell goes to Node as one JSON line on a pipe (stdin is /dev/null);
its outcome comes back as one JSON line on another:
the value's display formats, or the error. Node starts at the first
cell, not with the kernel: a sandbox restored from a warm image starts
its own Node, whose random generators (Math.random, OpenSSL's) no other
sandbox restored from that image shares, which a reseed could not give
it (V8 takes no new seed). The server starts its default JavaScript
kernel at first use too (server.go Start).
"""

import json
import os
import secrets
import queue
import subprocess
import sys
import threading

from ipykernel.kernelapp import IPKernelApp

from bashkernel import BashKernel

HERE = os.path.dirname(os.path.abspath(__file__))


class JSKernel(BashKernel):
    implementation = "sandstorm-js"
    implementation_version = "1"
    language = "javascript"
    language_version = "ES2022"
    language_info = {"name": "javascript", "mimetype": "text/javascript", "file_extension": ".js"}
    banner = "Node.js"
    # The program the child runs (main sets it from the command line).
    program = "node"

    def start_bash(self):
        # Named for the frame's hook: starts nothing until the first cell.
        self.bash = None

    def child_argv(self, cells, outcomes):
        """The child's command: it reads cells from the fd cells and
        writes their outcomes to the fd outcomes."""
        # vm code has import() only with --experimental-vm-modules, and
        # import.meta.resolve takes a parent only with the other flag
        # (Node 18); jsrunner.js says why it needs both.
        return [self.program, "--experimental-vm-modules", "--experimental-import-meta-resolve",
                os.path.join(HERE, "jsrunner.js"), self.mark.decode(), self.language,
                str(cells), str(outcomes)]

    def encode_cell(self, code):
        return (json.dumps({"code": code}) + "\n").encode()

    def start_node(self):
        self.mark = ("\x1esandstorm-%s " % secrets.token_hex(8)).encode()
        cells_r, cells_w = os.pipe()
        out_r, out_w = os.pipe()
        self.bash = subprocess.Popen(
            # ipykernel ignores SIGINT outside its handlers: env gives
            # the child the default back, so its own handlers take it.
            ["env", "--default-signal=INT"] + self.child_argv(cells_r, out_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            bufsize=0, pass_fds=(cells_r, out_w))
        os.close(cells_r)
        os.close(out_w)
        self.cells_pipe = os.fdopen(cells_w, "wb", buffering=0)
        self.outcomes = os.fdopen(out_r, "r")

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False, *, cell_id=None):
        if not code.strip():
            return self.ok()
        if self.bash is None or self.bash.poll() is not None:
            # Not started, or ended between cells: its pipes go with it.
            self.restart_bash()
            self.start_node()
        out = queue.Queue()
        readers = [threading.Thread(target=self.read, args=(getattr(self.bash, name), name, out), daemon=True)
                   for name in ("stdout", "stderr")]
        for r in readers:
            r.start()
        try:
            self.cells_pipe.write(self.encode_cell(code))
        except OSError:
            readers = []
        status = self.relay(readers, out, silent)
        if status is None:
            # Node is gone (the cell ended it) or would not stop.
            self.restart_bash()
            return self.error(silent, "Error", "%s exited; a new one starts with the next cell" % self.banner)
        outcome = json.loads(self.outcomes.readline() or "{}")
        if status == "interrupted":
            return self.error(silent, "KeyboardInterrupt", "interrupted")
        if "error" in outcome:
            e = outcome["error"]
            return self.error(silent, e["ename"], e["evalue"], e.get("traceback", []))
        if "mime" in outcome and not silent:
            self.send_response(self.iopub_socket, "execute_result", {
                "execution_count": self.execution_count, "data": outcome["mime"], "metadata": {}})
        return self.ok()

    def restart_bash(self):
        if self.bash is not None:
            try:
                self.bash.kill()
                self.bash.wait(timeout=5)
            except Exception:
                pass
        self.bash = None

    def error(self, silent, ename, evalue, traceback=None):
        content = {"ename": ename, "evalue": evalue, "traceback": traceback or []}
        if not silent:
            self.send_response(self.iopub_socket, "error", content)
        content.update(status="error", execution_count=self.execution_count)
        return content


def main(kernel_class, infos):
    """Launches kernel_class. The command line is: LANGUAGE PROGRAM -f
    CONNECTION_FILE, the first two for this kernel (a language of infos,
    and the program its child runs), the rest for ipykernel's."""
    if len(sys.argv) > 2 and not sys.argv[1].startswith("-"):
        kernel_class.language, kernel_class.program = sys.argv[1], sys.argv[2]
        kernel_class.language_info = infos[kernel_class.language]
        del sys.argv[1:3]
    IPKernelApp.launch_instance(kernel_class=kernel_class)


if __name__ == "__main__":
    main(JSKernel, {
        "javascript": {"name": "javascript", "mimetype": "text/javascript", "file_extension": ".js"},
        "typescript": {"name": "typescript", "mimetype": "text/typescript", "file_extension": ".ts"},
    })
