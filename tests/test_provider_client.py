"""The openai provider's clients are built once per process and configuration
and shared by every run and thread; a forked work horse inherits one its
parent built but never used, and builds its own when the parent used it;
a worker loads what runs need before it forks, opening no connection."""

import os
import threading

import pytest
from django.db import connection

from runs.providers import openai_clients
from runs.providers.openai_chat import OpenAIChatProvider
from runs.providers.openai_clients import shared_clients
from runs.runtime import enqueue, run
from runs.workers.preload import load_for_runs
from tests.fake_openai import Reply, completion

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"kind": "openai", "model": "fake-model"}


def _ask(clients) -> dict:
    """A chat completion sent through ``clients`` as the provider sends one."""
    return clients.post("/chat/completions", body={"model": "m", "messages": []}, cast_to=object)


@pytest.fixture(autouse=True)
def no_clients_yet():
    openai_clients._clients.clear()
    yield
    openai_clients._clients.clear()


def test_runs_share_one_client_per_configuration(fake_openai, settings):
    fake_openai.script(Reply(200, completion("one")), Reply(200, completion("two")))
    first = run({"prompt": "p", "provider": SPEC})
    second = run({"prompt": "p", "provider": SPEC})
    assert (first.output, second.output) == ("one", "two")
    assert len(openai_clients._clients) == 1
    client = shared_clients()
    assert OpenAIChatProvider(SPEC).client is client

    settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS = 7  # another configuration
    other = OpenAIChatProvider(SPEC).client
    assert other is not client and other.timeout.read == 7


def test_threads_asking_at_once_get_the_same_client_and_their_answers(fake_openai):
    clients, answers, start = [], [], threading.Barrier(8)

    def ask():
        start.wait()
        client = shared_clients()
        clients.append(client)
        answers.append(_ask(client))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(client) for client in clients}) == 1
    assert len(answers) == 8 and len(fake_openai.requests) == 8


def _in_a_child(check) -> bool:
    """Whether ``check()`` is true in a forked child of this process; a
    child that raises fails the test, never answers False."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no database, no pytest; answer and go
        try:
            answer = b"1" if check() else b"0"
        except BaseException as error:  # noqa: BLE001  (told to the parent)
            answer = f"E{error!r}".encode()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    answer = os.read(read, 4096)
    os.waitpid(pid, 0)
    assert answer in (b"0", b"1"), f"the child failed: {answer.decode()}"
    return answer == b"1"


def test_a_horse_sends_through_its_own_client_when_its_parent_used_one(fake_openai):
    """The parent sends through its client; a child forked then builds a
    client of its own and sends through it; the parent sends again: every
    request is answered."""
    client = shared_clients()

    def ask():
        return _ask(client)

    ask()
    assert _in_a_child(
        lambda: shared_clients() is not client and bool(_ask(shared_clients())["choices"])
    )
    assert ask()["choices"], "the parent's connection survived its child"
    assert len(fake_openai.requests) == 3


def test_a_horse_inherits_a_client_its_parent_built_and_never_used(fake_openai):
    openai_clients.built_clients()
    [(built, used_by)] = openai_clients._clients.values()
    assert used_by is None
    assert _in_a_child(lambda: shared_clients() is built)


def test_a_horse_builds_its_own_client_when_its_parent_used_one(fake_openai):
    used = shared_clients()
    assert not _in_a_child(lambda: shared_clients() is used)
    assert shared_clients() is used  # the parent keeps its own


@pytest.mark.worker
@pytest.mark.parametrize("worker_class", ["runs.worker.Worker", "runs.worker.SimpleWorker"])
def test_a_worker_loads_them_before_its_first_job(fake_openai, workers, queue, worker_class):
    fake_openai.script(Reply(200, completion("from a horse")))
    agent_run = enqueue({"prompt": "p", "provider": SPEC})
    output = workers.run_burst(NRLLM_WORKER_CLASS=worker_class)
    loaded = output.index("loaded for runs before any job")
    assert "the openai SDK and client" in output[loaded:].splitlines()[0]
    assert loaded < output.index(agent_run.pk.hex[:8]), "loaded after the job began"
    agent_run.refresh_from_db()
    assert agent_run.output == "from a horse"


def test_a_worker_loads_the_sdk_and_the_client_before_it_forks_and_opens_no_connection(
    fake_openai,
):
    connection.close()
    load_for_runs()
    assert connection.connection is None, "loading opened a database connection"
    [(_, used_by)] = openai_clients._clients.values()
    assert used_by is None and fake_openai.requests == [], "loading sent a request"
