"""``manage.py`` processes forked from an interpreter that has imported the
libraries each of them imports, rather than started from nothing.

A worker's start costs about 1.6 s of CPU, two thirds of it importing
Django, psycopg, redis, RQ, httpx and the like. ``make test`` starts some
500 ``manage.py`` processes (364 workers) on 2 cores: about a quarter of
its CPU. Forked from this module's server, a worker starts in about 0.5 s.

What runs is still the real ``manage.py``, in a process of its own, with
the test's arguments, environment, working directory and standard
streams. The project, ``django.setup()`` and the settings are imported in
the child, after the fork; only libraries are preloaded, none of which
reads a setting as it is imported. The model and MCP SDKs, which a worker
imports when a run first uses one (about 1 s of CPU each, in some 150 of
the suite's workers), are imported by the server as well but kept out of
each child's ``sys.modules`` until it imports one of an SDK's modules: then
it gets all of them at once, the server's (``DEFERRED``). A library may
read the environment as it is imported, so a process whose environment
differs from the server's in anything but the variables in
``READ_LATER`` (the project's, read by the settings in the child) is
started the usual way. So is every process
when ``NRLLM_TEST_PRELOAD=0``, and every command but ``manage.py``.

The test holds a ``subprocess.Popen`` whose pid is the child's: signals,
psutil's walk of its tree and its CPU are the real process's. The server
waits for its children and sends each one's exit status to the test; if
the server is gone, waiting raises rather than make a status up.

What differs from a fresh start, and why it is kept: the children of one
server share its hash seed (set and dict orders agree between them, as
they would in one process); the server reaps a child as it exits, so
psutil no longer finds an ended process the test has not waited for (the
tree walks here allow for that, or walk a worker expected to be alive);
its command line reads ``python -m tests.preloaded``; a child that imports
one SDK has the other's modules as well, and their modules' specs name a
loader of this module's (``_HandedBack``: the file's own loader behind it);
and the loggers the SDKs' import made are every child's.

    python -m tests.preloaded SOCKET   (started by ``PreloadedPopen``)
"""

import atexit
import contextlib
import gc
import importlib
import importlib.machinery
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Imported by the server before any fork: libraries a worker's start
#: imports (-X importtime), and nothing they do not bring in, none of which
#: reads a Django setting as it is imported (``test_preloaded.py`` checks
#: both). Not the model and MCP SDKs (``DEFERRED``) or OpenTelemetry's SDK:
#: tests assert which processes import them.
PRELOAD = (
    "django.core.management",
    "django.core.checks",
    "django.core.mail",
    "django.db.models",
    "django.db.migrations",
    "django.db.backends.postgresql.base",
    "django.forms",
    "django.template.defaulttags",
    "django.template.defaultfilters",
    "django.urls",
    "django.http",
    "django.contrib.admin",
    "django.contrib.messages",
    "django.utils.log",
    "rq.worker",
    "rq.cron",
    "redis.asyncio",
    "psycopg",
    "psycopg_pool",
    "httpx",
    "anyio",
    "jsonschema",
    "regex",
    "croniter",
    "cronsim",
    "standardwebhooks",
    "psutil",
    "sqlparse",
)

#: Imported by the server too, after ``PRELOAD``, but kept out of each
#: child's ``sys.modules`` until the child imports them (``_Deferred``): the
#: SDKs a worker imports when a run first uses them (``runs.providers``,
#: ``tools.mcp``), about 1 s of CPU each. A child that never does has none
#: of them (``test_preloaded.py``), as a fresh process
#: (``test_worker_footprint``).
DEFERRED = (
    "openai",
    "mcp",
    "mcp.client.stdio",
    "mcp.client.streamable_http",
    "mcp.shared._httpx_utils",
    "mcp.shared.exceptions",
    "mcp_types.version",
)

#: The variables a child may have that the server has not, or other
#: values of: the project's, read by its settings in the child after the
#: fork; the tests' MCP servers', read by those (started from nothing);
#: and pytest's name of the current test.
READ_LATER = (
    "TRACKER_",
    "LIAR_",
    "NRLLM_",
    "DATABASE_",
    "REDIS_URL",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "DEBUG",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "PYTEST_CURRENT_TEST",
    "PYTHONUNBUFFERED",
)

#: The environment the server is started with: the test process's as this
#: module was first imported (at the session's start, before any test
#: changed it).
SERVER_ENV = dict(os.environ)


# --- the test's side ---------------------------------------------------------


class PreloadedPopen(subprocess.Popen):
    """``subprocess.Popen`` that forks ``python manage.py ...`` from the
    server where it can, and otherwise starts it as ``Popen`` does."""

    _forked = False
    _status = None  # the server's connection, until the exit status came

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):  # fmt: skip
        plain = (executable, preexec_fn, pass_fds, shell, gid, gids, uid, process_group)
        request = None
        if plain == (None, None, (), False, None, None, None, -1) and umask < 0:
            request = _request(args, cwd, env, start_new_session)
        pid = None if request is None else self._fork(request, p2cread, c2pwrite, errwrite)
        if pid is None:
            super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                restore_signals, gid, gids, uid, umask, start_new_session, process_group,
            )  # fmt: skip
            return
        self.pid = pid
        self._child_created = True
        self._forked = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _fork(self, request: bytes, *streams: int) -> int | None:
        """The forked child's pid, or None if the server did not fork it (the
        process is then started as usual)."""
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(_server())
            connection.settimeout(60)
            # -1: the test's own, as Popen's child inherits it.
            streams = [fd if fd != -1 else own for own, fd in enumerate(streams)]
            socket.send_fds(connection, [request], streams)
        except OSError:  # nothing forked yet
            connection.close()
            return None
        try:
            reply = connection.recv(64)
        except BaseException:  # a child may be running: no second one
            connection.close()
            raise
        if not reply.isdigit():  # the server's fork failed
            connection.close()
            return None
        self._status = connection
        return int(reply)

    def _internal_poll(self, _deadstate=None, **kwargs):
        if not self._forked:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:  # unless another thread waited
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is None:
                    raise
                self.returncode = _deadstate  # as Popen's, from __del__
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def _try_wait(self, wait_flags):
        if not self._forked:
            return super()._try_wait(wait_flags)
        if self._status is None:
            return self._without_server(wait_flags)
        self._status.setblocking(not wait_flags & os.WNOHANG)
        try:
            message = self._status.recv(64)
        except BlockingIOError:
            return (0, 0)
        self._status.close()
        self._status = None
        if not message:
            return self._without_server(wait_flags)
        return (self.pid, int(message))

    def _without_server(self, wait_flags):
        """The server is gone, and the exit status with it: the child runs
        while its pid does; once it has ended, waiting raises rather than
        make a status up."""
        while True:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                raise ChildProcessError(
                    f"tests.preloaded: the server is gone; the exit status of {self.pid} is lost"
                ) from None
            if wait_flags & os.WNOHANG:
                return (0, 0)
            time.sleep(0.1)


def _request(args, cwd, env, new_session) -> bytes | None:
    """What the server needs to fork ``args``, or None if it may not."""
    if os.environ.get("NRLLM_TEST_PRELOAD") == "0":
        return None
    if not isinstance(args, list | tuple) or not all(isinstance(arg, str) for arg in args):
        return None
    if list(args[:2]) != [sys.executable, "manage.py"]:
        return None
    if not isinstance(cwd, str | Path | None) or Path(cwd or os.getcwd()).resolve() != ROOT:
        return None
    env = dict(os.environ if env is None else env)
    if not all(isinstance(item, str) for pair in env.items() for item in pair):
        return None
    changed = {key for key in env.keys() | SERVER_ENV.keys() if env.get(key) != SERVER_ENV.get(key)}
    if any(not key.startswith(READ_LATER) for key in changed):
        return None
    request = {"argv": list(args[1:]), "cwd": str(ROOT), "env": env, "new_session": new_session}
    return json.dumps(request).encode()


_started = {}
_starting = threading.Lock()


def _server() -> str:
    """This process's server's socket, the server started at first use."""
    with _starting:
        if "path" not in _started:
            _started["server"], _started["path"] = _start_server()
        return _started["path"]


def _start_server() -> tuple[subprocess.Popen, str]:
    path = os.path.join(tempfile.mkdtemp(prefix="nrllm-preloaded-"), "socket")
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.preloaded", path],
        cwd=ROOT,
        # Without settings: a library that read one as it is imported fails
        # the server's start instead of settling the children's settings.
        env={key: value for key, value in SERVER_ENV.items() if key != "DJANGO_SETTINGS_MODULE"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    # It ends when its standard input does: when this process does.
    atexit.register(_stop, server, path, os.getpid())
    if server.stdout.readline() != b"ready\n":
        raise RuntimeError(f"tests.preloaded: the server did not start ({server.wait()})")
    return server, path


def _stop(server: subprocess.Popen, path: str, owner: int) -> None:
    if os.getpid() != owner:  # a fork of the test's process
        return
    server.stdin.close()
    server.stdout.close()
    server.wait(timeout=30)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


# --- the server's side -------------------------------------------------------


def serve(path: str):
    """Preload, then fork a child for each request until standard input
    ends. Returns only in a child: its request and standard streams."""
    for name in PRELOAD:
        importlib.import_module(name)
    before, exit_functions = set(sys.modules), atexit._ncallbacks()
    for name in DEFERRED:
        importlib.import_module(name)
    deferred = {name: sys.modules.pop(name) for name in set(sys.modules) - before}
    # What their import registered to run at exit is known, and undone (it is
    # registered again as its module is handed back); anything more fails here.
    known = _AS_IMPORTED.keys() & deferred.keys()
    assert atexit._ncallbacks() == exit_functions + len(known), "an unknown exit function"
    for name in known:
        atexit.unregister(deferred[name]._exit_function)
    sys.meta_path.insert(0, _Deferred(deferred, {name.split(".")[0] for name in DEFERRED}))
    assert threading.active_count() == 1, "a preloaded library started a thread"
    from django.conf import settings

    assert not settings.configured, "a preloaded library read the settings"
    # What is preloaded lives as long as each child: kept out of the
    # collector, its pages stay shared instead of being copied at a child's
    # first collection.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(woken, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    waiting = {}  # pid -> the connection its exit status goes to
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not os.read(sys.stdin.fileno(), 1024):
                    sys.exit(0)
            elif key.fileobj is listener:
                child = _accept(listener, waiting)
                if child is not None:
                    connection, request, streams = child
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for kept in (listener, connection, *waiting.values()):
                        kept.close()
                    for fd in (woken, wake):
                        os.close(fd)
                    selector.close()
                    return request, streams
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(woken, 1024):
                        pass
                _report_ended(waiting)


#: What importing a module does beyond making it, done again as a deferred
#: module is handed back (the server undid it after ``DEFERRED``'s imports):
#: multiprocessing registers its exit function as ``util`` is imported.
_AS_IMPORTED = {"multiprocessing.util": lambda util: atexit.register(util._exit_function)}


class _Deferred:
    """The modules ``DEFERRED``'s imports brought in, out of ``sys.modules``
    until the child imports one, and then handed back: the server's own
    objects, never run again. The first module of an SDK (``roots``) puts
    all of them back at once, because a module of theirs may use another
    without importing it (a pydantic model built at its first use looks its
    module's namespace up in ``sys.modules``); any other (``shlex``,
    ``multiprocessing.connection``, which a worker may import for itself)
    comes back with only what it holds (``_held_by``). A module's spec is
    its ``_HandedBack`` from the
    server on: an import racing another thread's, which finds the module
    put back meanwhile and loads it by its spec, gets it back too. A
    reload reads the file again, as in a fresh process."""

    def __init__(self, modules: dict, roots: set):
        self.modules, self.roots = modules, roots
        self.put_back = False
        self.handing = threading.Lock()  # two threads handing back one module
        self.specs = {}
        for name, module in modules.items():
            made = getattr(module, "__spec__", None)
            spec = self.specs[name] = importlib.machinery.ModuleSpec(
                name,
                _HandedBack(self, module, getattr(made, "loader", None)),
                origin=getattr(made, "origin", None),
                loader_state=getattr(made, "loader_state", None),
                is_package=getattr(made, "submodule_search_locations", None) is not None,
            )
            if made is not None:
                spec.submodule_search_locations = made.submodule_search_locations
                spec.cached, spec.has_location = made.cached, made.has_location
                # The two agree, as the import system leaves them (Python warns
                # of a module whose __loader__ is not its spec's).
                module.__spec__, module.__loader__ = spec, spec.loader
        # A package of the server's keeps no attribute naming a deferred
        # submodule: ``from multiprocessing import util`` imports it, as in a
        # fresh process, instead of finding it.
        self.detached = []
        for name, module in modules.items():
            parent, _, child = name.rpartition(".")
            package = sys.modules.get(parent)
            if package is not None and getattr(package, child, None) is module:
                delattr(package, child)
                self.detached.append((package, child, module))

    def find_spec(self, name, path=None, target=None):
        return None if target is not None else self.specs.get(name)

    def handing_back(self, name: str, module) -> None:
        """``name`` is being imported: put back what comes back with it."""
        with self.handing:
            if not self.put_back and name.partition(".")[0] in self.roots:
                self.put_back = True
                wanted = self.modules.keys()
            else:
                wanted = self._held_by(name)
            back = {other: self.modules[other] for other in wanted if other not in sys.modules}
            back[name] = module
            sys.modules.update({other: made for other, made in back.items() if other != name})
            for package, child, made in self.detached:
                if back.get(made.__name__) is made:
                    setattr(package, child, made)
            for done_again in back.keys() & _AS_IMPORTED.keys():
                _AS_IMPORTED[done_again](back[done_again])

    def _held_by(self, name: str) -> set:
        """``name``, its packages and the deferred modules its namespace
        holds (a module, or a class or function of one), and theirs in turn:
        what its import made that it uses (``multiprocessing.connection``'s
        ``util``), as a fresh process would have them."""
        held, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in held or current not in self.modules or current in sys.modules:
                continue
            held.add(current)
            todo.append(current.rpartition(".")[0])
            for value in vars(self.modules[current]).values():
                if isinstance(value, types.ModuleType):
                    todo.append(value.__name__)
                elif isinstance(value, type | types.FunctionType):
                    todo.append(value.__module__)
            todo = [name for name in todo if isinstance(name, str)]
        return held


class _HandedBack:
    """The loader of a deferred module: hands the server's module back, run
    already; for the rest (its files, source and resources) the loader that
    made it."""

    def __init__(self, deferred: _Deferred, module, made_by):
        self._deferred, self._module, self._made_by = deferred, module, made_by

    def create_module(self, spec):
        self._deferred.handing_back(spec.name, self._module)
        return self._module

    def exec_module(self, module):
        pass

    def __getattr__(self, name):
        if name.startswith("_"):  # its own, unset (a copy): not the loader's
            raise AttributeError(name)
        return getattr(self._made_by, name)


def _accept(listener: socket.socket, waiting: dict) -> tuple | None:
    """Fork a child for the next connection's request. In the child: the
    connection, the request and its standard streams; in the server, None
    (the child's pid sent, and its connection kept in ``waiting``)."""
    connection, _ = listener.accept()
    connection.settimeout(5)  # a test that connected and sends nothing holds no one up
    try:
        message, streams, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    except OSError:  # gone, or silent
        connection.close()
        return None
    pid = None
    if message and len(streams) == 3:
        try:
            pid = os.fork()
        except OSError:  # the test starts it as usual
            with contextlib.suppress(OSError):
                connection.send(b"-")
    if pid == 0:
        return connection, json.loads(message), streams
    for fd in streams:
        os.close(fd)
    if pid is None:
        connection.close()
        return None
    waiting[pid] = connection
    with contextlib.suppress(OSError):
        connection.send(str(pid).encode())
    return None


def _report_ended(waiting: dict) -> None:
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is None:
            continue
        with contextlib.suppress(OSError):  # unless the test no longer waits
            connection.send(str(status).encode())
        connection.close()


def run_child(request: dict, streams: list[int]):
    """Become ``python manage.py ...`` as the request asks."""
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    for fd in set(streams) - {0, 1, 2}:
        os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _standard_streams(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
    sys.argv = request["argv"]
    sys.path[0] = request["cwd"]
    # As ``python manage.py`` runs it: argv[0] as given, __file__ absolute.
    script = os.path.abspath(sys.argv[0])
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__cached__ = None
    sys.modules["__main__"] = main
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    exec(code, main.__dict__)


def _standard_streams(*, unbuffered: bool) -> None:
    """New ``sys.stdin``, ``stdout`` and ``stderr`` on fds 0-2, as the
    interpreter makes them at start (``-u``: ``PYTHONUNBUFFERED``), with
    the encodings and error handlers of the server's own, whose locale is
    the child's."""

    def stream(fd: int, old):
        # stdin is buffered even with -u; a tty and stderr by lines, without.
        buffered = fd == 0 or not unbuffered
        binary = open(fd, "wb" if fd else "rb", buffering=-1 if buffered else 0, closefd=False)
        (binary.raw if buffered else binary).name = ("<stdin>", "<stdout>", "<stderr>")[fd]
        return io.TextIOWrapper(
            binary,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
            write_through=unbuffered,
        )

    sys.stdin = sys.__stdin__ = stream(0, sys.__stdin__)
    sys.stdout = sys.__stdout__ = stream(1, sys.__stdout__)
    sys.stderr = sys.__stderr__ = stream(2, sys.__stderr__)


if __name__ == "__main__":
    run_child(*serve(sys.argv[1]))
