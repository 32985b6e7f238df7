"""Sandstorm demo server.

GET /         -> 200 "count=N pid=P\n"; N increments on every request, so a
                 client can prove that memory survived pause or
                 checkpoint/restore. When HEAP_MIB > 0 (set in the builder, or
                 in the environment) the body also carries
                 " heap_bytes=B" (the size of the resident numpy array).
GET /heap     -> 200 "sum=S bytes=B\n" (reads every page of the heap; only
                 when HEAP_MIB > 0).
GET /healthz  -> 200 "ok".
GET /random   -> 200 "random=R urandom=U started=S": a draw of Python's
                 random module, 8 bytes of os.urandom in hex, and when this
                 process started. Sandboxes restored from one warm image all
                 share S; they differ in R only once reseeded (SIGUSR1 below)
                 and in U always (the sentry serves getrandom from the host).
GET /hostname -> 200 "H\n": the hostname the sandbox sees (its name).

SIGUSR1 reseeds the random module from os.urandom: the demo's answer to a
warm template's reseed ("warm": {"reseed": {"signal": "SIGUSR1"}}).

Listens on 0.0.0.0:8000; the PORT environment variable overrides the port.
"""

import os
import random
import signal
import socket
import time
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEAP_MIB = 0  # rewritten by the demo builder
# A template may ask for another heap size (the memory flood test and
# benchmark do); numpy must be in the rootfs for any heap (app64's is).
HEAP_MIB = int(os.environ.get("HEAP_MIB", HEAP_MIB))

heap = None
if HEAP_MIB:
    import numpy

    # float64 ones: 8 bytes each, every page written, so the heap is resident.
    heap = numpy.ones(HEAP_MIB * 1024 * 1024 // 8)

_lock = threading.Lock()
_count = 0
_started = time.time()


class Handler(BaseHTTPRequestHandler):
    server_version = "sandstorm-demo/1"

    def do_GET(self):
        global _count
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._reply(200, "ok")
        elif path == "/":
            with _lock:
                _count += 1
                n = _count
            body = "count=%d pid=%d" % (n, os.getpid())
            if heap is not None:
                body += " heap_bytes=%d" % heap.nbytes
            self._reply(200, body + "\n")
        elif path == "/fetch":
            # GET /fetch?url=U: fetch U the way any program would (the
            # sandbox's resolver and default route, no proxy settings) and
            # answer "<status> <body>". Egress goes through the sandbox's
            # boundary, so this shows what the boundary lets through.
            from urllib.parse import parse_qs, urlsplit
            import urllib.request, urllib.error
            url = parse_qs(urlsplit(self.path).query).get("url", [""])[0]
            try:
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(url, timeout=10) as r:
                    self._reply(200, "%d %s" % (r.status, r.read(65536).decode("utf-8", "replace")))
            except urllib.error.HTTPError as e:
                self._reply(200, "%d %s" % (e.code, e.read(4096).decode("utf-8", "replace")))
            except Exception as e:
                self._reply(200, "error %s" % e)
        elif path == "/random":
            self._reply(200, "random=%r urandom=%s started=%r\n" % (random.random(), os.urandom(8).hex(), _started))
        elif path == "/hostname":
            self._reply(200, socket.gethostname() + "\n")
        elif path == "/heap" and heap is not None:
            self._reply(200, "sum=%d bytes=%d\n" % (int(heap.sum()), heap.nbytes))
        else:
            self._reply(404, "not found\n")

    def _reply(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        pass


class Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def server_bind(self):
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can
        # stall in a sandbox without a resolver; skip it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def main():
    # As PID 1 in a sandbox, SIGTERM is ignored unless handled.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: random.seed())
    port = int(os.environ.get("PORT", "8000"))
    srv = Server(("0.0.0.0", port), Handler)
    print("listening on 0.0.0.0:%d pid=%d" % (port, os.getpid()), flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
