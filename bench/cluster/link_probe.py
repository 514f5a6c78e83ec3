#!/usr/bin/env python3
"""Measures the link between the two hosts of bench/cluster/cluster.sh: the round-trip time of a
one-byte TCP ping-pong (median of 2000) and the rate of one TCP stream, as the receiver counts it.

    link_probe.py serve ADDRESS          on one host (answers one measure, then exits)
    link_probe.py measure ADDRESS SECS   on the other
"""
import socket
import statistics
import sys
import time

PORT = 29777
CHUNK = 1 << 20


def serve(address):
    with socket.create_server((address, PORT)) as listener:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while (b := conn.recv(1)) != b"e":  # ping-pong until "e"
                conn.sendall(b)
            received, start = 0, None
            while chunk := conn.recv(CHUNK):
                if start is None:
                    start = time.perf_counter()
                received += len(chunk)
            seconds = time.perf_counter() - start
            conn.sendall(f"{received} {seconds}".encode())


def measure(address, seconds):
    deadline = time.time() + 10
    while True:
        try:
            conn = socket.create_connection((address, PORT))
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(2000):
            t = time.perf_counter()
            conn.sendall(b"p")
            conn.recv(1)
            rtts.append(time.perf_counter() - t)
        conn.sendall(b"e")
        data = b"\0" * CHUNK
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        received, took = conn.recv(100).decode().split()
    rate = int(received) * 8 / float(took) / 1e9
    print(f"rtt median {statistics.median(rtts) * 1e3:.3f} ms (p10 "
          f"{statistics.quantiles(rtts, n=10)[0] * 1e3:.3f}, p90 "
          f"{statistics.quantiles(rtts, n=10)[-1] * 1e3:.3f}); one TCP stream "
          f"{rate:.2f} Gbit/s over {float(took):.1f} s")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        measure(sys.argv[2], float(sys.argv[3]))
