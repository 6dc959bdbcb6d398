"""A TCP link that a test can cut: a forwarder from a local port to a server, standing for one
host's network path to a database. `cut()` drops its open connections and closes every new one
at once (a partition that the client sees as a dropped connection), `heal()` lets connections
through again. No privileges needed, unlike network namespaces."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableLink:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for end in self._open:
                _close(end)
            self._open.clear()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        _close(self.listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if self._cut.is_set():
                _close(client)
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    _close(sink)


def _close(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        end.close()
