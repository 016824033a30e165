"""HTTP to one inference server, for a served member: how bytes go out and come back (member.py owns
what they say).

Built on urllib3 (pooled keep-alive connections). What every request gets:
- an overall deadline: connecting, sending, the wait for the answer and the whole body, retries
  included. A socket timeout alone applies per read, so a server that trickles one byte every
  second would never time out; a watchdog shuts the request's socket down at the deadline instead;
- retries on a refused or broken connection and on HTTP 502/503/504 (a proxy's or a loading
  server's "try again"): the calls are idempotent, so a few retries with short backoff, all inside
  the deadline;
- no redirects followed (one would turn a POST into a bodiless GET, or send prompts elsewhere);
- no proxy unless the operator asks (`?proxy=env`): prompts to a loopback server must not leave
  the machine because the environment names a proxy;
- a cap on the size of answers and error bodies, so a server cannot exhaust this process's memory;
- credentials from the URL (`user:password@`) sent as HTTP basic auth and never shown: every URL
  in a message reads `***@host`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError, ProxyError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from ...errors import MemberError, SpecfuseError

RETRIES = 3  # after the first try: refused or broken connections, HTTP 502/503/504
RETRY_STATUSES = frozenset({502, 503, 504})
BACKOFF_S = 0.1  # before the first retry; doubled before each next one; never past the deadline
MAX_BODY_BYTES = 64 * 2**20  # an answer: vLLM's prompt log-probs for 32k-token contexts stay well below
MAX_ERROR_BYTES = 64 * 2**10  # read of an error body; the rest is not read
MAX_ERROR_QUOTE = 300  # characters of an error body quoted in a message
POOL_SIZE = 8  # idle keep-alive connections kept per server (more are opened when needed)
PROXY_MODES = ("none", "env")  # ?proxy=: none (the default) or the environment's HTTP(S)_PROXY
CHUNK = 64 * 2**10

_USERINFO = re.compile(r"(?<=//)[^/?#\s]*@")  # user:password@ after scheme:// (greedy: a@b@host)


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***`: `http://***@host`."""
    return _USERINFO.sub("***@", text)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without `user:password@`, (user, password) or None)."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    clean = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return clean, (urllib.parse.unquote(user), urllib.parse.unquote(password))


def shown_url(url: str, auth: tuple[str, str] | None) -> str:
    """How a server's URL appears in names, messages and traces: its credentials as `***`."""
    if auth is None:
        return redact(url)
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}***@{rest}"


# ---- the deadline's watchdog --------------------------------------------------------------------------

_current = threading.local()  # the _Watch of the request this thread is making, if any


class _Watch:
    """Shuts down the socket of one request when its deadline passes: a blocked read then returns at
    once, however slowly the server trickles bytes."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._socket = sock
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._socket is not None:
                _shut(self._socket)

    def stop(self) -> bool:
        """Disarm (before the connection goes back to the pool); whether the deadline had passed."""
        self._timer.cancel()
        with self._lock:
            self._socket = None
            return self.expired


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for a TLS socket: SSLSocket.shutdown would drop its TLS
    # state under the thread that is reading.
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watched:
    """A connection that hands its socket to the current request's watchdog once the request is sent
    (connecting is bounded by the connect timeout, set to what is left of the deadline)."""

    sock: socket.socket | None

    def request(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().request(*args, **kwargs)  # type: ignore[misc]
        finally:
            watch = getattr(_current, "watch", None)
            if watch is not None and self.sock is not None:
                watch.attach(self.sock)


class _Connection(_Watched, HTTPConnection):
    pass


class _TLSConnection(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


def _manager(url: str, proxy: str) -> urllib3.PoolManager:
    """A pool of connections to `url`'s server, through the environment's proxy only if asked."""
    manager: urllib3.PoolManager
    target = None
    if proxy == "env":
        parts = urllib.parse.urlsplit(url)
        target = urllib.request.getproxies().get(parts.scheme)
        if target and urllib.request.proxy_bypass(parts.hostname or ""):
            target = None  # NO_PROXY names it
    if target:
        manager = urllib3.ProxyManager(target, num_pools=2, maxsize=POOL_SIZE)
    else:
        manager = urllib3.PoolManager(num_pools=2, maxsize=POOL_SIZE)
    manager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
    return manager


class _Again(Exception):
    """A failure worth another try (the calls are idempotent): what happened, then what to do or
    what the server said; the count of tries goes between them if none is left."""

    def __init__(self, what: str, rest: str = "") -> None:
        super().__init__(what + rest)
        self.what, self.rest = what, rest

    def error(self, tries: int) -> MemberError:
        counted = f" (after {tries} tries)" if tries > 1 else ""
        return MemberError(f"{self.what}{counted}{self.rest}")


# ---- JSON over HTTP ---------------------------------------------------------------------------------


class Http:
    """JSON over HTTP to one server; every failure becomes a MemberError naming the member and server.

    `url` may hold `user:password@` (sent as basic auth, shown as `***@`); `auth` gives them apart.
    `timeout` is each request's overall deadline in seconds.
    """

    def __init__(
        self,
        member: str,
        engine: str,
        url: str,
        timeout: float,
        *,
        auth: tuple[str, str] | None = None,
        proxy: str = "none",
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        if proxy not in PROXY_MODES:
            raise ValueError(f"proxy must be one of {', '.join(PROXY_MODES)}, not {proxy!r}")
        clean, in_url = split_credentials(url.rstrip("/"))
        auth = auth or in_url
        self.member, self.engine, self.timeout, self.max_body = member, engine, timeout, max_body
        self.url = shown_url(clean, auth)  # what messages show
        self._target = clean  # what requests go to
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._manager = _manager(clean, proxy)

    def __repr__(self) -> str:
        return f"Http({self.member!r}, {self.engine}, {self.url!r})"

    def where(self) -> str:
        return f"{self.member}: the {self.engine} server at {self.url}"

    def malformed(self, path: str, detail: object) -> MemberError:
        return MemberError(f"{self.where()} sent a malformed answer to {path} ({detail})")

    @contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """Turn a missing key or a wrong type in a server's answer into a MemberError."""
        try:
            yield
        except SpecfuseError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise self.malformed(what, f"{type(e).__name__}: {e}") from e

    def call(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        """GET `path` (no payload) or POST `payload` as JSON; the decoded JSON answer."""
        body = None if payload is None else json.dumps(payload).encode()
        deadline = time.monotonic() + self.timeout
        tries = 0
        while True:
            tries += 1
            try:
                data = self._once("GET" if body is None else "POST", path, body, deadline)
                break
            except _Again as again:
                wait = BACKOFF_S * 2 ** (tries - 1)
                if tries > RETRIES or time.monotonic() + wait >= deadline:
                    raise again.error(tries) from again.__cause__
                time.sleep(wait)
        try:
            return json.loads(data)
        except ValueError as e:
            raise self.malformed(path, f"not JSON: {data[:80]!r}") from e

    # ---- one try ------------------------------------------------------------------------------------

    def _once(self, method: str, path: str, body: bytes | None, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._late(path)
        watch = _Watch(left)
        _current.watch = watch
        try:
            response = self._manager.urlopen(
                method,
                self._target + path,
                body=body,
                headers=self._headers,
                timeout=urllib3.Timeout(total=left),
                retries=False,
                redirect=False,
                preload_content=False,
            )
            whole = False
            try:
                if response.status >= 300:
                    what, rest = self._status_error(path, response)
                    if watch.stop():
                        raise self._late(path)
                    if response.status in RETRY_STATUSES:
                        raise _Again(what, rest)
                    raise MemberError(what + rest)
                data, whole = self._read(response, path, self.max_body, strict=True)
            finally:
                expired = watch.stop()  # before the connection can serve another request
                if not whole:  # an unread rest would be taken for the next request's answer
                    response.close()
                response.release_conn()
            if expired:  # the body may look whole where the server had it end by closing
                raise self._late(path)
            return data
        except (HTTPError, OSError, http.client.HTTPException) as e:
            timed_out = isinstance(e, (Urllib3Timeout, TimeoutError)) and not isinstance(
                e,
                NewConnectionError,  # urllib3 counts a refused connection among its timeouts
            )
            if watch.stop() or timed_out:
                raise self._late(path) from e
            if isinstance(e, (NewConnectionError, ProxyError)):
                raise _Again(f"{self.where()} is unreachable ({_reason(e)})", "; is it running?") from e
            if isinstance(e, (ProtocolError, ConnectionError, http.client.HTTPException)):
                raise _Again(f"{self.where()} broke off its answer to {path} ({_reason(e)})") from e
            raise MemberError(f"{self.where()} failed on {path}: {_reason(e)}") from e
        finally:
            watch.stop()
            _current.watch = None

    def _read(self, response: Any, path: str, cap: int, *, strict: bool) -> tuple[bytes, bool]:
        """The body, at most `cap` bytes: beyond them a MemberError (strict) or the first `cap`
        bytes and False (an error body, only quoted)."""
        declared = response.headers.get("Content-Length", "")
        if strict and declared.isdigit() and int(declared) > cap:
            raise self._too_big(path, cap, f"it announced {int(declared):,} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = response.read(CHUNK)
            if not chunk:
                return b"".join(chunks), True
            size += len(chunk)
            if size > cap:
                response.close()  # the rest is not read: the connection cannot serve again
                if strict:
                    raise self._too_big(path, cap, "it sent more")
                chunks.append(chunk[: cap - (size - len(chunk))])
                return b"".join(chunks), False
            chunks.append(chunk)

    def _status_error(self, path: str, response: Any) -> tuple[str, str]:
        """(what happened, what to do or what the server said) for an answer other than 2xx."""
        what = f"{self.where()} answered HTTP {response.status} to {path}"
        if 300 <= response.status < 400:
            location = redact(str(response.headers.get("Location", "?")))[:200]
            response.close()
            return what, (
                f", a redirect to {location}; redirects are not followed: name the server's own "
                "URL in the spec"
            )
        try:
            raw, whole = self._read(response, path, MAX_ERROR_BYTES, strict=False)
        except (HTTPError, OSError, http.client.HTTPException):
            raw, whole = b"", False
        detail = redact(raw.decode("utf-8", "replace"))[:MAX_ERROR_QUOTE]
        more = "" if whole and len(raw) <= MAX_ERROR_QUOTE else " …"
        return what, f": {detail}{more}"

    def _late(self, path: str) -> MemberError:
        return MemberError(
            f"{self.where()} did not answer {path} within {self.timeout:g} s (the request's whole "
            "deadline: connecting, waiting and reading); is it overloaded? Raise the spec's "
            "?timeout= or check the server"
        )

    def _too_big(self, path: str, cap: int, how: str) -> MemberError:
        return MemberError(
            f"{self.where()} answered {path} with more than {cap:,} bytes ({how}); answers are "
            "capped so that a server cannot exhaust this process's memory"
        )


def _reason(error: BaseException) -> str:
    """The innermost cause's words (e.g. 'Connection refused'), without object reprs or credentials."""
    seen = error
    for _ in range(8):  # its causes, and urllib3's ProtocolError(message, cause)
        if isinstance(seen, OSError) and seen.strerror:
            return redact(seen.strerror)
        inner = next((a for a in seen.args if isinstance(a, BaseException)), None) or seen.__cause__
        if inner is None:
            break
        seen = inner
    text = str(seen)
    if seen is not error and not text.startswith(type(seen).__name__):
        text = f"{type(seen).__name__}: {text}"
    text = re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>:\s*", "", text)
    return redact(text)[:200] or type(error).__name__
