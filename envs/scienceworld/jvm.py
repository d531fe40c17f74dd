"""ScienceWorld JVMs: launch (with -Xmx, a call timeout and a fixed hash order), kill, the errors that mean "it
died", quiet logs, and `JvmHost`: one JVM serving one or several environments.

`start_jvm` does what `scienceworld.ScienceWorldEnv.__init__` does (py4j `launch_gateway` on ScienceWorld's jar,
then a `PythonInterface` server object), plus three things:

* Memory: the java command line gets ``-Xmx{java_heap_mb}m`` (default 512; 0 = the JVM default), which bounds a
  JVM's resident memory (measured: docs/scienceworld.md, Robustness). Deviation from "set JAVA_TOOL_OPTIONS": a
  flag on the command line changes no process-wide environment variable, so JVMs can be started from parallel
  threads. When the user has set JAVA_TOOL_OPTIONS we add nothing, so their settings apply.
* A py4j socket read timeout (``call_timeout_s``): a JVM call slower than that raises, i.e. counts as a crash.
* A fixed order (always on; ``start_jvm(..., fixed_hash_order=False)`` gives a stock JVM, for measurements only):
  ScienceWorld keeps a room's objects in hash sets keyed by Java identity hash codes, which HotSpot draws from
  per-thread random streams; py4j serves calls on whichever of its Java threads is free, so the order in which a
  room lists its objects (and the valid-action list, and so the action-correction choice among ties) changed from
  run to run. ``-XX:hashCode=2`` gives every object the same identity hash, so the sets keep insertion order: the
  same text on every run, in any thread, in a shared JVM. Deviation: the listing order differs from a stock JVM's
  (which has no fixed order); the objects, the dynamics and the scores are the same. How often runs differed and
  the step times with and without it: docs/scienceworld.md, Robustness.

The env talks to the server object directly, so the package's Python wrapper class is never built.

`JvmHost` (``env.scienceworld.jvms``): several environments can share one JVM, each with its own PythonInterface
(its own simulated world). ScienceWorld keeps two pieces of a world's state process-wide: the object-id counter
(``util.UniqueIdentifier``, reset by every load) and Scala's global random generator (``scala.util.Random``,
seeded with the variation by every load and drawn at every tick, e.g. by wandering animals). So environments on a
host take turns (one call sequence at a time), and on a change of turn the host saves the previous environment's
counter and generator seed and restores the next one's (`JvmHost.session`): every environment sees exactly what it
would see in a JVM of its own (tested). Reading the generator's seed needs ``--add-opens java.base/java.util``.
A crash or timeout of a shared JVM ends the episodes of all its environments (each gets ``env_error``) and the next
call starts a fresh JVM.

`env_errors()` are the exceptions of a dead, killed or failing JVM (py4j errors, socket errors); the env answers them
by restarting the JVM. py4j and scienceworld are imported only when a JVM is started.

Logging: py4j reports every call into a dead JVM with a full traceback on the *root* logger (which also makes
logging install a default stderr handler if none exists). The env handles those errors itself, so the first
`start_jvm` (not the import of this module) adds, once per process, a root-logger filter that drops exactly those
records, and sets the "py4j" logger to CRITICAL unless the application set its level.
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager

_quiet_lock = threading.Lock()


class _DropPy4JRootTracebacks(logging.Filter):
    """Drops py4j's "while sending command" tracebacks on the root logger; other root records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not ("py4j" in record.pathname and "while sending command" in str(record.msg))


def quiet_py4j_logging() -> None:
    """Install the root-logger filter and the py4j logger level (idempotent)."""
    with _quiet_lock:
        if logging.getLogger("py4j").level == logging.NOTSET:
            logging.getLogger("py4j").setLevel(logging.CRITICAL)
        root = logging.getLogger()
        if not any(isinstance(f, _DropPy4JRootTracebacks) for f in root.filters):
            root.addFilter(_DropPy4JRootTracebacks())


def env_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the JVM died, was killed or failed a call."""
    from py4j.protocol import Py4JError

    return (Py4JError, OSError, EOFError)


class Jvm:
    """A running ScienceWorld JVM: its process, its py4j gateway and the PythonInterface server object."""

    def __init__(self, gateway, proc, server):
        self.gateway, self.proc, self.server = gateway, proc, server

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """Shut the gateway down and end the process (never raises)."""
        kill_jvm(self.gateway, self.proc)


FIXED_HASH_ORDER = ["-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2"]  # every identity hash is 1
OPEN_RANDOM = ["--add-opens", "java.base/java.util=ALL-UNNAMED"]  # JvmHost reads java.util.Random's seed
RANDOM_MULTIPLIER = 0x5DEECE66D  # java.util.Random: setSeed(s) stores s ^ this (nextGaussian's cache: never used)


def start_jvm(java_heap_mb: int, call_timeout_s: float, fixed_hash_order: bool = True) -> Jvm:
    """Launch a ScienceWorld JVM and connect to it. fixed_hash_order=False (a stock JVM) is only for measuring the
    difference (results/determinism/jvm_hash_order.py); environments always run with the fixed order."""
    from py4j.java_gateway import CallbackServerParameters, GatewayParameters, JavaGateway, launch_gateway
    from scienceworld.constants import BASEPATH, JAR_PATH

    quiet_py4j_logging()
    javaopts = list(OPEN_RANDOM) + (FIXED_HASH_ORDER if fixed_hash_order else [])
    if java_heap_mb > 0 and "JAVA_TOOL_OPTIONS" not in os.environ:
        javaopts.append(f"-Xmx{int(java_heap_mb)}m")
    port, proc = launch_gateway(
        classpath=JAR_PATH, javaopts=javaopts, die_on_exit=True, cwd=BASEPATH, return_proc=True
    )
    try:
        timeout = call_timeout_s if call_timeout_s > 0 else None
        gateway = JavaGateway(
            gateway_parameters=GatewayParameters(auto_field=True, port=port, read_timeout=timeout),
            callback_server_parameters=CallbackServerParameters(port=0, daemonize=True),
            java_process=proc,
        )
        python_port = gateway.get_callback_server().get_listening_port()
        gateway.java_gateway_server.resetCallbackClient(
            gateway.java_gateway_server.getCallbackClient().getAddress(), python_port
        )
        server = gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
    except BaseException:
        kill_jvm(None, proc)
        raise
    return Jvm(gateway, proc, server)


def kill_jvm(gateway, proc) -> None:
    """Shut down a py4j gateway and end a JVM process, either may be None (never raises)."""
    if gateway is not None:
        try:
            gateway.shutdown()
        except Exception:
            pass
    if proc is None:
        return
    try:
        if proc.poll() is None:
            proc.stdin.write(b"\n")  # --die-on-broken-pipe: the JVM exits when its stdin closes
            proc.stdin.flush()
            proc.stdin.close()
            proc.wait(timeout=3)
    except Exception:
        pass
    try:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
    except Exception:
        pass


class JvmHost:
    """One JVM serving one or several environments; each environment gets its own PythonInterface (`server`).

    Environments call `session(token)` around every sequence of server calls: calls on a host are serialised, and
    when the turn passes to another environment its per-world JVM globals (object-id counter, global random seed)
    are swapped in. After a crash, `failed(generation)` kills the JVM once (other environments that then fail on
    the same dead JVM find it already replaced) and the next `server()` starts a fresh one."""

    def __init__(self, java_heap_mb: int, call_timeout_s: float):
        self.java_heap_mb, self.call_timeout_s = java_heap_mb, call_timeout_s
        self._lock = threading.RLock()
        self._jvm: Jvm | None = None
        self.generation = 0  # +1 per JVM started: tells a server of a dead JVM from a live one
        self._users = 0
        self._next_token = 0
        self._owner: int | None = None  # whose world globals are in the JVM now
        self._saved: dict[int, tuple[int, int]] = {}  # token -> (object-id counter, random seed) while not in turn
        self._ids = self._seed = None  # py4j proxies: UniqueIdentifier module; (global java.util.Random, its seed field)

    @property
    def pid(self) -> int | None:
        return self._jvm.pid if self._jvm is not None else None

    def register(self) -> int:
        """A new environment on this host: its token for `session`."""
        with self._lock:
            self._users += 1
            self._next_token += 1
            return self._next_token

    def unregister(self, token: int) -> None:
        """An environment closed; the last one stops the JVM."""
        with self._lock:
            self._users -= 1
            self._saved.pop(token, None)
            if self._users <= 0:
                self._kill()

    def server(self, token: int) -> tuple[object, int]:
        """(a new PythonInterface for environment `token`, the JVM generation it lives in); starts the JVM if none
        runs (the caller is then the one whose globals are in it)."""
        with self._lock:
            if self._jvm is None:
                self._jvm = start_jvm(self.java_heap_mb, self.call_timeout_s)
                self.generation += 1
                self._owner, self._saved, self._ids, self._seed = token, {}, None, None
                return self._jvm.server, self.generation  # the one start_jvm made
            return self._jvm.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface(), self.generation

    def failed(self, generation: int) -> None:
        """A call into JVM `generation` failed: kill it (once; a later generation is left alone)."""
        with self._lock:
            if generation == self.generation:
                self._kill()

    def _kill(self) -> None:
        jvm, self._jvm, self._owner, self._ids, self._seed = self._jvm, None, None, None, None
        if jvm is not None:
            jvm.kill()

    @contextmanager
    def session(self, token: int):
        """Hold the host for one environment's calls, with that environment's world globals in the JVM."""
        with self._lock:
            if self._owner != token:
                if self._users > 1 and self._jvm is not None:
                    try:
                        self._swap(token)
                    except env_errors():  # a dead JVM: the environment's own next call fails and restarts it
                        self._kill()
                self._owner = token
            yield

    def _swap(self, token: int) -> None:
        if self._ids is None:
            gateway = self._jvm.gateway
            module = gateway.jvm.java.lang.Class.forName("util.UniqueIdentifier$").getField("MODULE$").get(None)
            scala_random = gateway.jvm.java.lang.Class.forName("scala.util.Random$").getField("MODULE$").get(None)
            generator = scala_random.self()  # the java.util.Random behind scala.util.Random
            field = generator.getClass().getDeclaredField("seed")
            field.setAccessible(True)
            self._ids, self._seed = module, (generator, field)
        generator, field = self._seed
        if self._owner is not None:
            self._saved[self._owner] = (int(self._ids.count()), int(field.get(generator)))  # py4j: the AtomicLong's value
        if token in self._saved:  # an environment that never loaded a world has nothing to restore
            count, seed = self._saved.pop(token)
            getattr(self._ids, "count_$eq")(count)
            generator.setSeed(seed ^ RANDOM_MULTIPLIER)  # setSeed scrambles its argument with the multiplier
