"""A sample store in a process of its own: a key-value server on 127.0.0.1, as a
feature store, a cache server or a remote data service looks to a training job.

A client sends ``<index>\\n`` and gets back a 4-byte big-endian length and that
many bytes. Each answer comes after ``--latency-ms`` (the store looking the
sample up far away) and after ``--cpu-ms`` of computing (a store that builds
each sample itself, on this machine's cores). Every connection gets a thread.

With ``--shm PATH`` it listens on the Unix socket ``PATH`` instead and answers
through shared memory, as a data server on the same machine hands out large
samples without copying them through a socket: each connection first gets the
name of a ``multiprocessing.shared_memory`` block (one line), then each request
``<index>\n`` gets only the 4-byte length once the sample is written there.

It prints ``port <n>`` (or ``path <PATH>``) once listening, and exits after
``--lifetime-s`` whatever happens, or as soon as its standard input closes (the
process that started it is gone): a test never leaves it behind.

    python sample_store.py --latency-ms 30 --lifetime-s 120
    python sample_store.py --shm /tmp/store.sock --cpu-ms 20
"""

import argparse
import os
import socketserver
import struct
import sys
import threading
import time
from multiprocessing import shared_memory

FEATURES = 256
# Samples as float32 vectors, made once: looking one up costs the store nothing.
BODIES = [struct.pack(f"<{FEATURES}f", *[((i + k) % 97) / 97.0 for k in range(FEATURES)])
          for i in range(97)]  # fmt: skip


def burn(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x = (x * 31 + i) % 1000003
    return x


class Handler(socketserver.StreamRequestHandler):
    latency_s = 0.0
    cpu_s = 0.0
    shm = False

    def handle(self):
        block = None
        if self.shm:
            block = shared_memory.SharedMemory(create=True, size=len(BODIES[0]))
            self.wfile.write(f"{block.name}\n".encode())
            self.wfile.flush()
        try:
            self.serve(block)
        finally:
            if block is not None:
                block.close()
                block.unlink()

    def serve(self, block):
        while True:
            line = self.rfile.readline()
            if not line:
                return
            index = int(line)
            if self.latency_s:
                time.sleep(self.latency_s)
            if self.cpu_s:
                burn(self.cpu_s)
            body = BODIES[index % len(BODIES)]
            if block is not None:
                block.buf[: len(body)] = body
                self.wfile.write(struct.pack(">I", len(body)))
            else:
                self.wfile.write(struct.pack(">I", len(body)) + body)
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--cpu-ms", type=float, default=0.0)
    parser.add_argument("--lifetime-s", type=float, default=300.0)
    parser.add_argument("--shm", help="a Unix socket path: answer through shared memory")
    args = parser.parse_args()
    handler = type(
        "Store",
        (Handler,),
        {"latency_s": args.latency_ms / 1000, "cpu_s": args.cpu_ms / 1000, "shm": bool(args.shm)},
    )
    if args.shm:
        if os.path.exists(args.shm):
            os.unlink(args.shm)
        server = UnixServer(args.shm, handler)
        ready = f"path {args.shm}"
    else:
        server = Server(("127.0.0.1", args.port), handler)
        ready = f"port {server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(ready, flush=True)

    def watch_stdin():
        try:
            while sys.stdin.read(1):
                pass
        except (OSError, ValueError):
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    time.sleep(args.lifetime_s)
    os._exit(0)


if __name__ == "__main__":
    main()
