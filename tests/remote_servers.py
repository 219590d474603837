"""Real servers for the remote-cache tests: redis-server, nginx (WebDAV PUT), a small Python
HTTP cache and a forwarding HTTP proxy (for HTTPS_PROXY / HTTP_PROXY), and sockets that
never answer. Each runs on 127.0.0.1 on a free port, in the test's temp dir, and is killed at
teardown. tests/conftest.py loads them for every test (``pytest_plugins``).

What they need installed (Debian: ``apt-get install redis-server nginx``; ``.ci/run`` does
it): ``redis-server`` on PATH (or in /usr/sbin, /usr/bin), the Python package ``redis``
(the test extra), and ``nginx`` built with ``--with-http_dav_module`` (Debian's is). A
fixture whose server is missing skips its tests and says what to install.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

_SBIN = os.pathsep.join(("/usr/local/sbin", "/usr/sbin", "/sbin"))
#: seconds a server gets to start answering before its fixture fails
START_TIMEOUT = 15.0


def which(name: str) -> str | None:
    """``name`` on PATH or in the sbin dirs (nginx lives in /usr/sbin, often not on PATH)."""
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the server binding it may still lose a race;
    the starters below retry on another port when that happens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answer(port: int, request: bytes, timeout: float = 0.5, tls: bool = False) -> bytes:
    """What a server on ``port`` answers to ``request`` (b"" when nothing); ``tls``: over
    TLS, without checking the certificate (a readiness probe)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            if tls:
                import ssl

                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                with ctx.wrap_socket(s) as t:
                    t.sendall(request)
                    return t.recv(256)
            s.sendall(request)
            return s.recv(256)
    except OSError:
        return b""


def self_signed_cert(workdir: str) -> tuple[str, str]:
    """``(cert.pem, key.pem)``: a self-signed certificate for 127.0.0.1 (it is its own CA),
    made with the ``openssl`` command (skips the test when there is none)."""
    openssl = which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (Debian: apt-get install openssl)")
    os.makedirs(workdir, exist_ok=True)
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    done = subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"openssl could not make a test certificate:\n{done.stderr}")
    return cert, key


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed process always exits
        pass


def _log_tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-2000:]
    except OSError:
        return "(no log)"


# -- redis ------------------------------------------------------------------------------------


class RedisServer:
    """One ``redis-server`` process: no persistence, bound to 127.0.0.1, its files in
    ``workdir``. :meth:`kill` is a real SIGKILL."""

    def __init__(self, workdir: str, password: str | None = None, tls: bool = False) -> None:
        self.binary = which("redis-server")
        if self.binary is None:
            pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
        self.workdir = workdir
        self.password = password
        #: with ``tls``: the server's self-signed certificate (also the CA to trust)
        self.cert: str | None = None
        self.key: str | None = None
        if tls:
            self.cert, self.key = self_signed_cert(os.path.join(workdir, "tls"))
        self.port = 0
        self.proc: subprocess.Popen | None = None
        os.makedirs(workdir, exist_ok=True)
        self.log = os.path.join(workdir, "redis.log")
        last = ""
        for _ in range(5):
            if self._start():
                return
            last = _log_tail(self.log)
        raise RuntimeError(f"redis-server did not start; its log:\n{last}")

    def _start(self) -> bool:
        self.port = free_port()
        cmd = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self.workdir,
            "--logfile", self.log,
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            cmd += ["--requirepass", self.password]
        if self.cert:
            cmd[1:3] = ["--port", "0", "--tls-port", str(self.port)]
            cmd += ["--tls-cert-file", self.cert, "--tls-key-file", self.key]
            cmd += ["--tls-ca-cert-file", self.cert, "--tls-auth-clients", "no"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # lost the port race, or a bad flag: the caller retries
            reply = _answer(self.port, b"PING\r\n", tls=self.cert is not None)
            if reply.startswith((b"+PONG", b"-NOAUTH")):
                return True
            time.sleep(0.02)
        _stop(self.proc)
        return False

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0`` (``rediss://`` with TLS)."""
        auth = f":{self.password}@" if self.password else ""
        scheme = "rediss" if self.cert else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def client(self):
        """A redis-py client for the test itself (to read TTLs, write garbage, fill memory)."""
        redis = pytest.importorskip("redis", reason="the 'redis' package (test extra)")
        tls = {"ssl": True, "ssl_ca_certs": self.cert} if self.cert else {}
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=10, **tls
        )

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-conversation, as in a crash."""
        if self.proc is not None:
            _stop(self.proc)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """A fresh redis-server on 127.0.0.1 (``.url``, ``.client()``, ``.kill()``)."""
    server = RedisServer(str(tmp_path / "redis"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_server_password(tmp_path) -> Iterator[RedisServer]:
    """A fresh redis-server that requires the password ``s3cret-pw`` (``--requirepass``)."""
    server = RedisServer(str(tmp_path / "redis-pw"), password="s3cret-pw")
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_server_tls(tmp_path) -> Iterator[RedisServer]:
    """A fresh redis-server speaking only TLS (``rediss://``), with a self-signed
    certificate (``.cert``), so clients must be told to trust it."""
    server = RedisServer(str(tmp_path / "redis-tls"), tls=True)
    try:
        yield server
    finally:
        server.kill()


# -- nginx ------------------------------------------------------------------------------------

_NGINX_CONF = """\
{user}
worker_processes 1;
master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 128; }}
http {{
    log_format conn '$connection $request_method $uri $status';
    access_log {d}/access.log conn;
    default_type application/octet-stream;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        server_name localhost;
        location /cache/ {{
            root {d}/www;
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw;
            client_max_body_size 1g;
        }}
        # served read-only: a PUT here is refused (405)
        location /readonly/ {{
            root {d}/www;
        }}
        # basic auth: user "cuforge", password "s3cret-pw"
        location /private/ {{
            root {d}/www;
            auth_basic "cuforge";
            auth_basic_user_file {d}/htpasswd;
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw;
        }}
    }}
{tls_server}}}
"""

_NGINX_TLS_SERVER = """\
    server {{
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location /cache/ {{
            root {d}/www;
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw;
            client_max_body_size 1g;
        }}
    }}
"""


def _nginx_problem(binary: str | None) -> str | None:
    if binary is None:
        return "nginx is not installed (Debian: apt-get install nginx)"
    done = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False)
    if "with-http_dav_module" not in done.stdout + done.stderr:
        return f"{binary} was built without the WebDAV module (--with-http_dav_module)"
    return None


class NginxServer:
    """One nginx process (``master_process off``: one process, so :meth:`kill` leaves no
    worker behind) serving ``<workdir>/www`` with WebDAV ``PUT`` under ``/cache/``.
    ``.url`` is the cache URL; the file of ``<url>/<ns>/<kind>/<key>`` is
    ``<.root>/<ns>/<kind>/<key>``; ``.readonly_url`` refuses PUT; ``.private_url`` needs
    basic auth (``.user`` / ``.password``). ``.requests()``: what nginx logged (with its
    connection numbers). With ``tls``: also ``.https_url``, the same cache over TLS with a
    self-signed certificate (``.cert``)."""

    user = "cuforge"
    password = "s3cret-pw"

    def __init__(self, workdir: str, tls: bool = False) -> None:
        self.binary = which("nginx")
        problem = _nginx_problem(self.binary)
        if problem:
            pytest.skip(problem)
        self.workdir = workdir
        self.cert: str | None = None
        self.key: str | None = None
        self.tls_port = 0
        if tls:
            self.cert, self.key = self_signed_cert(os.path.join(workdir, "tls"))
        self.root = os.path.join(workdir, "www", "cache")
        for sub in ("www/cache", "www/readonly", "www/private", "tmp"):
            os.makedirs(os.path.join(workdir, sub), exist_ok=True)
        with open(os.path.join(workdir, "htpasswd"), "w") as f:
            f.write(f"{self.user}:{{PLAIN}}{self.password}\n")
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log = os.path.join(workdir, "error.log")
        last = ""
        for _ in range(5):
            if self._start():
                return
            last = _log_tail(self.log)
        raise RuntimeError(f"nginx did not start; its error log:\n{last}")

    def _start(self) -> bool:
        self.port = free_port()
        user = ""
        if os.geteuid() == 0:
            # as root, nginx would hand requests to 'nobody', who cannot write the temp dir
            import grp
            import pwd

            user = f"user {pwd.getpwuid(0).pw_name} {grp.getgrgid(0).gr_name};"
        tls_server = ""
        if self.cert:
            self.tls_port = free_port()
            tls_server = _NGINX_TLS_SERVER.format(
                d=self.workdir, port=self.tls_port, cert=self.cert, key=self.key
            )
        conf = os.path.join(self.workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(
                _NGINX_CONF.format(user=user, d=self.workdir, port=self.port, tls_server=tls_server)
            )
        self.proc = subprocess.Popen(
            [self.binary, "-c", conf, "-p", self.workdir + "/", "-e", self.log],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            probe = b"HEAD /cache/ HTTP/1.0\r\n\r\n"
            if _answer(self.port, probe).startswith(b"HTTP/") and (
                not self.cert or _answer(self.tls_port, probe, tls=True).startswith(b"HTTP/")
            ):
                return True
            time.sleep(0.02)
        _stop(self.proc)
        return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cache"

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}/cache"

    @property
    def readonly_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/readonly"

    def private_url(self, user: str | None = None, password: str | None = None) -> str:
        auth = ""
        if user is not None:
            auth = user + (f":{password}" if password is not None else "") + "@"
        return f"http://{auth}127.0.0.1:{self.port}/private"

    def requests(self) -> list[tuple[int, str, str, int]]:
        """``(connection number, method, uri, status)`` of each request logged so far
        (nginx writes its access log line when a request ends)."""
        rows = []
        with open(os.path.join(self.workdir, "access.log")) as f:
            for line in f:
                conn, method, uri, status = line.split()
                rows.append((int(conn), method, uri, int(status)))
        return rows

    def kill(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


@pytest.fixture
def nginx_server(tmp_path) -> Iterator[NginxServer]:
    """A fresh nginx with WebDAV PUT at ``.url`` (``http://127.0.0.1:PORT/cache``)."""
    server = NginxServer(str(tmp_path / "nginx"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def nginx_server_tls(tmp_path) -> Iterator[NginxServer]:
    """:func:`nginx_server` plus ``.https_url`` (TLS, self-signed certificate ``.cert``)."""
    server = NginxServer(str(tmp_path / "nginx-tls"), tls=True)
    try:
        yield server
    finally:
        server.kill()


# -- servers that never answer -----------------------------------------------------------------


class BlackHole:
    """Accepts every connection and never sends a byte (nor reads one): a hung server.
    ``.port``; ``.accepted`` counts connections; :meth:`close` drops them all."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="black-hole", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self._held.append(conn)

    @property
    def accepted(self) -> int:
        return len(self._held)

    def url(self, scheme: str = "redis") -> str:
        path = "/0" if scheme.startswith("redis") else "/cache"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for conn in self._held:
            conn.close()


class Tarpit:
    """A port whose connections never complete: it listens with a full backlog and never
    accepts, so a client's SYN gets no answer and ``connect`` itself hangs (what a firewall
    that drops packets does). Tests the connect timeout."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        self._fill: list[socket.socket] = []
        # Linux queues backlog+1 connections; fill them so later SYNs are dropped
        for _ in range(3):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(0.05)
            try:
                s.connect(("127.0.0.1", self.port))
            except OSError:
                s.close()
                break
            self._fill.append(s)

    def url(self, scheme: str = "redis") -> str:
        path = "/0" if scheme.startswith("redis") else "/cache"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        for s in self._fill:
            s.close()
        self._listener.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


@pytest.fixture
def tarpit() -> Iterator[Tarpit]:
    pit = Tarpit()
    try:
        yield pit
    finally:
        pit.close()


class ScriptedServer:
    """A tiny TCP server that misbehaves on purpose: ``handler(conn)`` runs in a thread for
    each accepted connection (then the connection is closed). ``.port``, ``.url(scheme)``,
    ``.connections`` (accepted so far). :meth:`read_request` reads one HTTP request."""

    def __init__(self, handler) -> None:
        self._handler = handler
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="scripted", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            self._handler(conn)
        except OSError:
            pass  # the client gave up (timeouts are what these servers test)
        finally:
            conn.close()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/cache"

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()

    @staticmethod
    def read_request(conn: socket.socket) -> bytes:
        return read_request(conn)


@pytest.fixture
def scripted_server() -> Iterator:
    """``scripted_server(handler)`` starts a :class:`ScriptedServer` (closed at teardown)."""
    servers: list[ScriptedServer] = []

    def start(handler) -> ScriptedServer:
        server = ScriptedServer(handler)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request's head and body (by its Content-Length) from ``conn`` (b"": the
    client closed the connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


# -- an HTTP cache and a forwarding proxy, in Python ------------------------------------------


class HttpCacheServer:
    """A real HTTP cache server on 127.0.0.1 (``http.server``, one thread per connection,
    keep-alive): ``PUT`` stores a body under its path, ``GET`` / ``HEAD`` answer it or 404.
    ``.url`` is ``http://127.0.0.1:PORT/cache`` (``https://`` with ``tls``: a self-signed
    certificate, ``.cert``); ``.requests`` lists ``(method, path)``; ``.store`` the bodies."""

    def __init__(self, workdir: str | None = None, tls: bool = False) -> None:
        import http.server

        server = self
        self.store: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.cert: str | None = None

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, status: int, body: bytes = b"", head: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                server.requests.append(("GET", self.path))
                body = server.store.get(self.path)
                self._answer(404) if body is None else self._answer(200, body)

            def do_HEAD(self) -> None:
                server.requests.append(("HEAD", self.path))
                body = server.store.get(self.path)
                self._answer(404 if body is None else 200, body or b"", head=True)

            def do_PUT(self) -> None:
                server.requests.append(("PUT", self.path))
                length = int(self.headers.get("Content-Length", "0"))
                created = self.path not in server.store
                server.store[self.path] = self.rfile.read(length)
                self._answer(201 if created else 204)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        if tls:
            import ssl

            assert workdir is not None, "tls needs a workdir for the certificate"
            self.cert, key = self_signed_cert(os.path.join(workdir, "tls"))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.cert, key)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/cache"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class ForwardingProxy:
    """A real forwarding HTTP proxy on 127.0.0.1 (one thread per connection, keep-alive):
    a request with an absolute URL (``GET http://host:port/path``) is forwarded to that host
    and its answer relayed; ``CONNECT host:port`` opens a tunnel and relays bytes both
    ways. ``.requests`` lists ``(method, target, Proxy-Authorization or None)`` of every
    request it was sent; ``.url`` is ``http://127.0.0.1:PORT``. With ``credentials``
    (``"user:pw"``), a request without them gets ``407``."""

    def __init__(self, credentials: str | None = None) -> None:
        import base64
        import http.client
        import http.server
        import urllib.parse

        proxy = self
        self.requests: list[tuple[str, str, str | None]] = []
        wanted = None
        if credentials is not None:
            wanted = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _allowed(self) -> bool:
                auth = self.headers.get("Proxy-Authorization")
                proxy.requests.append((self.command, self.path, auth))
                if wanted is None or auth == wanted:
                    return True
                self.send_response(407)
                self.send_header("Proxy-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False

            def _forward(self) -> None:
                if not self._allowed():
                    return
                target = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("proxy-authorization", "connection", "host")
                }
                upstream = http.client.HTTPConnection(
                    target.hostname, target.port or 80, timeout=10
                )
                try:
                    upstream.request(self.command, target.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for k, v in answer.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = _forward

            def do_CONNECT(self) -> None:
                if not self._allowed():
                    return
                host, _, port = self.path.rpartition(":")
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
                self.send_response(200, "Connection established")
                self.end_headers()
                self.wfile.flush()
                _relay(self.connection, upstream)
                self.close_connection = True

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between ``a`` and ``b`` until either side closes."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select(timeout=10):
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        sel.close()
        b.close()


@pytest.fixture
def http_cache_server() -> Iterator[HttpCacheServer]:
    """A :class:`HttpCacheServer` (plain HTTP), closed at teardown."""
    server = HttpCacheServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def https_cache_server(tmp_path) -> Iterator[HttpCacheServer]:
    """A :class:`HttpCacheServer` over TLS (self-signed ``.cert``), closed at teardown."""
    server = HttpCacheServer(str(tmp_path), tls=True)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def forwarding_proxy() -> Iterator:
    """``forwarding_proxy(credentials=None)`` starts a :class:`ForwardingProxy`."""
    proxies: list[ForwardingProxy] = []

    def start(credentials: str | None = None) -> ForwardingProxy:
        started = ForwardingProxy(credentials)
        proxies.append(started)
        return started

    yield start
    for started in proxies:
        started.close()


__all__ = [
    "BlackHole",
    "ForwardingProxy",
    "HttpCacheServer",
    "NginxServer",
    "RedisServer",
    "ScriptedServer",
    "Tarpit",
    "free_port",
    "read_request",
    "which",
]
