"""A real S3-protocol server for the s3:// tests: moto's standalone server (``python -m
moto.server``, from ``moto[server]``) on 127.0.0.1, a free port, one per test, killed at
teardown. ``make test-s3`` installs moto[server] and boto3 into .venv-s3 and runs these
tests; without them the tests skip and say what to install.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest

from tests.remote_servers import START_TIMEOUT, _answer, free_port

BUCKET = "cuforge-test"
MISSING = "boto3 and moto[server] (make test-s3 installs them into .venv-s3)"


class S3Server:
    """A moto server holding one bucket, :data:`BUCKET`."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port
        self.endpoint = f"http://127.0.0.1:{port}"

    def url(self, prefix: str = "team") -> str:
        return f"s3://{BUCKET}/{prefix}?endpoint={self.endpoint}&region=us-east-1"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def available() -> str | None:
    """Why the S3 tests cannot run here (None: they can)."""
    for module in ("boto3", "moto", "flask"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: needs {MISSING}"
    return None


@pytest.fixture(name="s3_server")
def s3_server_fixture(tmp_path, monkeypatch):
    """A fresh moto S3 server (:class:`S3Server`); import this name into a test module to
    use the fixture ``s3_server`` there."""
    why = available()
    if why is not None:
        pytest.skip(why)
    # credentials of the usual chain (moto accepts any): never from the cache dir
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 - closed with the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = S3Server(proc, port)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answer(port, b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"moto server did not start: {(tmp_path / 'moto.log').read_text()}"
                )
            time.sleep(0.05)
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.kill()
        log.close()
