"""A real S3 API on loopback for the tests: moto's server mode in a subprocess of its own.

Started once per test session (:func:`start`) on a free port of 127.0.0.1; each test takes a
bucket of its own. The stores under test talk to it over HTTP exactly as to AWS S3 or MinIO:
nothing of the client is replaced.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

ACCESS_KEY = "pitstop-test-access"
SECRET_KEY = "pitstop-test-secret-do-not-print"


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """What a process needs to reach it as AWS: credentials, region, endpoint."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def new_bucket(self) -> str:
        """A fresh, empty bucket's name (made through the S3 API itself)."""
        import urllib.request

        name = f"t-{uuid.uuid4().hex[:20]}"
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        # moto accepts unsigned bucket creation; objects are written by signed requests only.
        urllib.request.urlopen(request, timeout=30).close()
        return name

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start() -> S3Server:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.1)
    return S3Server(f"http://127.0.0.1:{port}", process)
