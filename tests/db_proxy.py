"""A TCP proxy between a test and PostgreSQL that breaks connections where a
test says: the faults of an unreliable network, at the wire.

A ``Rule`` fires on the first client message holding its ``marker``:
``drop_reply`` lets the statement reach the server and commit, then closes
the client's connection before the reply (committed, unheard);
``kill_before`` closes it before the statement is sent (never arrived). With
``then_refuse`` the next N new connections are refused (the database is
away for a while), and ``on_fire`` runs first (what happens meanwhile).
"""

import contextlib
import socket
import threading

from django.db import connection

#: PostgreSQL's ReadyForQuery message: the server has finished a statement
#: (and its commit, in autocommit).
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class Rule:
    """What to do with the first client message that holds ``marker``."""

    def __init__(self, marker: bytes, action: str, then_refuse: int = 0, on_fire=None):
        assert action in ("drop_reply", "kill_before")
        self.marker = marker
        self.action = action
        self.then_refuse = then_refuse
        #: Run when the rule fires, before the client hears anything.
        self.on_fire = on_fire
        self.fired = threading.Event()


class FaultProxy:
    def __init__(self, upstream):
        self.upstream = upstream
        self.rules: list[Rule] = []
        self.refuse = 0
        self.refused = 0
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(50)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, rule: Rule) -> Rule:
        with self.lock:
            self.rules.append(rule)
        return rule

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.refuse > 0:
                    self.refuse -= 1
                    self.refused += 1
                    _close(client)
                    continue
            server = socket.create_connection(self.upstream)
            state = {"drop": None}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, server, state), daemon=True).start()

    def _match(self, data: bytes):
        with self.lock:
            for rule in self.rules:
                if not rule.fired.is_set() and rule.marker in data:
                    self.rules.remove(rule)
                    return rule
        return None

    def _fire(self, rule: Rule):
        if rule.on_fire is not None:
            rule.on_fire()
        with self.lock:
            self.refuse += rule.then_refuse
        rule.fired.set()

    def _up(self, client, server, state):
        tail = b""
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(server)
                return
            rule = self._match(tail + data)
            tail = data[-64:]
            if rule is not None and rule.action == "kill_before":
                # Never reaches the server: nothing commits.
                self._fire(rule)
                _close(client)
                _close(server)
                return
            if rule is not None:
                state["drop"] = rule
            try:
                server.sendall(data)
            except OSError:
                return

    def _down(self, client, server, state):
        swallowed = b""
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(client)
                return
            if state["drop"] is not None:
                swallowed += data
                if READY_FOR_QUERY in swallowed:
                    rule = state["drop"]
                    self._fire(rule)
                    _close(client)
                    _close(server)
                    return
                continue
            try:
                client.sendall(data)
            except OSError:
                return

    def close(self):
        _close(self.listener)


def _close(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@contextlib.contextmanager
def proxied_connection():
    """This process's database connection goes through a ``FaultProxy``."""
    settings_dict = connection.settings_dict
    proxy = FaultProxy((settings_dict["HOST"], int(settings_dict["PORT"])))
    connection.close()
    original = settings_dict["PORT"]
    settings_dict["PORT"] = str(proxy.port)
    try:
        yield proxy
    finally:
        connection.close()
        settings_dict["PORT"] = original
        proxy.close()
