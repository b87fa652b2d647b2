"""G12 when a record commits but its reply never reaches the worker (the
connection drops after the server committed: a network blip, a failover, a
proxy restart). The worker cannot know whether the steps landed; it asks
the database before it writes anything again, so no step is ever recorded
twice and the journal stays a prefix of what the attempt did.

The fault is real: a TCP proxy between this process and PostgreSQL forwards
the statement, lets the server commit it, and closes the connection instead
of passing the reply on.
"""

import socket
import threading

import pytest
from django.db import connection

from runs.faults import _refusing_trigger
from runs.models import AgentRun, RunStep
from runs.runtime import enqueue, run_queued
from tests.helpers import answer, call, scripted
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class AckDroppingProxy:
    """Forwards PostgreSQL connections; the first client message that
    contains ``marker`` reaches the server, but its reply (up to the
    ReadyForQuery that follows the commit) is swallowed and the client's
    connection closed."""

    def __init__(self, upstream: tuple[str, int], marker: bytes):
        self.upstream = upstream
        self.marker = marker
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(50)
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = {"drop": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, server, state), daemon=True).start()

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
            with self._lock:
                if self.armed.is_set() and self.marker in tail + data:
                    self.armed.clear()
                    state["drop"] = True
            tail = data[-len(self.marker) :]
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
            if state["drop"]:
                swallowed += data
                if READY_FOR_QUERY in swallowed:
                    # Committed; the worker never hears of it.
                    _close(client)
                    _close(server)
                    self.dropped.set()
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


@pytest.fixture
def proxied(queue):
    """This process's database connection goes through the proxy."""
    settings_dict = connection.settings_dict
    upstream = (settings_dict["HOST"], int(settings_dict["PORT"]))
    proxy = AckDroppingProxy(upstream, b"ZZMARK")
    connection.close()
    original = settings_dict["PORT"]
    settings_dict["PORT"] = str(proxy.port)
    yield proxy
    connection.close()
    settings_dict["PORT"] = original
    proxy.close()


def fresh(agent_run):
    return AgentRun.objects.get(pk=agent_run.pk)


def test_a_read_step_whose_commit_reply_was_lost_is_not_written_twice(proxied):
    """A read's record commits but its reply is lost; the write that follows
    and its turn are recorded; the next model call fails (retryable). The
    retry resumes and finishes, and the journal holds each step once."""
    Note.objects.create(slug="release", body="v2 is ready ZZMARK")
    agent_run = enqueue(
        scripted(
            call("search_notes", query="release"),
            call("send_notification", recipient="ops", message="v2 shipped"),
            {"error": "server_error", "attempts": 1},
            answer("done"),
            tools=["search_notes", "send_notification"],
        )
    )
    proxied.armed.set()
    run_queued(agent_run.pk)  # attempt 1
    assert proxied.dropped.is_set(), "the proxy never dropped a reply"
    assert fresh(agent_run).status == "queued"  # requeued for the retry
    searches = RunStep.objects.filter(run=agent_run, kind="tool", tool_name="search_notes")
    journal = list(
        RunStep.objects.filter(run=agent_run, kind__in=["llm", "tool"])
        .order_by("sequence")
        .values_list("sequence", "kind", "tool_name")
    )
    assert [kind for _, kind, _ in journal] == ["llm", "tool", "llm", "tool"], journal
    run_queued(agent_run.pk)  # attempt 2: the retry
    agent_run = fresh(agent_run)
    assert OutboxNotification.objects.count() == 1
    # The search ran once; its step must be in the journal once.
    assert searches.count() == 1, journal
    assert agent_run.status == "completed", (agent_run.termination_reason, agent_run.error_message)


def test_a_read_whose_reply_was_lost_is_never_replayed_as_another_calls_outcome(proxied):
    """One turn calls search_notes twice (different queries). The first
    record's reply is lost, the second call's record is refused, then the
    model call fails. The retry replays the first search and runs the second
    live: each call's outcome is its own."""
    Note.objects.create(slug="release", body="v2 is ready ZZMARK")
    Note.objects.create(slug="other", body="unrelated")
    agent_run = enqueue(
        scripted(
            {
                "tool_calls": [
                    {"name": "search_notes", "arguments": {"query": "release"}},
                    {"name": "search_notes", "arguments": {"query": "other"}},
                ]
            },
            {"error": "server_error", "attempts": 1},
            answer("done"),
            tools=["search_notes"],
        )
    )
    proxied.armed.set()
    with _refusing_trigger(
        "probe_refuse_other",
        "INSERT",
        RunStep._meta.db_table,
        "NEW.kind = 'tool' AND NEW.arguments ->> 'query' = 'other'",
        "second search's step refused (injected fault)",
    ):
        run_queued(agent_run.pk)  # attempt 1
    assert proxied.dropped.is_set()
    assert fresh(agent_run).status == "queued"
    run_queued(agent_run.pk)  # attempt 2
    agent_run = fresh(agent_run)
    assert agent_run.status == "completed", agent_run.error_message
    searches = list(
        RunStep.objects.filter(run=agent_run, kind="tool")
        .order_by("sequence")
        .values_list("arguments", "lease_token")
    )
    assert searches == [({"query": "release"}, 1), ({"query": "other"}, 2)]


def test_a_resume_step_whose_commit_reply_was_lost_is_recorded_and_counted_once(
    proxied, drifting_model
):
    """The resume step's record commits but its reply is lost: the attempt
    finds it recorded and goes on; the tokens replay saved count once."""
    from tests.drifting_model import openai_request
    from tests.fake_openai import error

    search = {"name": "search_notes", "arguments": {"query": "v2 (take {take})"}}
    drifting_model.fail_turn(1, error(500))
    agent_run = enqueue(
        openai_request("look", [{"calls": [search]}, {"answer": "found"}], ["search_notes"])
    )
    proxied.marker = b"resumed after step"
    run_queued(agent_run.pk)  # attempt 1: turn 0 and its search recorded, turn 1 fails
    assert fresh(agent_run).status == "queued"
    proxied.armed.set()
    run_queued(agent_run.pk)  # attempt 2: resumes
    assert proxied.dropped.is_set()
    agent_run = fresh(agent_run)
    resumes = list(agent_run.steps.filter(kind="resume").values_list("sequence", "lease_token"))
    assert agent_run.status == "completed"
    assert len(resumes) == 1, resumes
    assert agent_run.tokens_saved_by_replay == 18  # turn 0: 11 prompt + 7 completion


def test_a_write_whose_record_committed_unheard_goes_on_instead_of_failing_its_audit(proxied):
    """The write's own record commits, its reply is lost: asked, the
    database says the step is there, so the audit did not fail (G2) and the
    run goes on; the notification was sent once and recorded once."""
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="ops", message="v2 shipped ZZMARK"),
            answer("sent"),
            tools=["send_notification"],
        )
    )
    proxied.marker = b"notification_id"
    proxied.armed.set()
    run_queued(agent_run.pk)
    assert proxied.dropped.is_set()
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.output) == ("completed", "sent")
    assert OutboxNotification.objects.count() == 1
    assert agent_run.steps.filter(kind="tool").count() == 1
    assert agent_run.pending_effect == ""
