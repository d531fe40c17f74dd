"""One ScienceWorld JVM: launch (with -Xmx and a call timeout), kill, the errors that mean "it died", quiet logs.

`start_jvm` does what `scienceworld.ScienceWorldEnv.__init__` does (py4j `launch_gateway` on ScienceWorld's jar,
then a `PythonInterface` server object), plus two things:

* Memory: the java command line gets ``-Xmx{java_heap_mb}m`` (default 512 MB; ~370 MB RSS measured; 0 = the JVM
  default, 0.6-1 GB RSS). Deviation from "set JAVA_TOOL_OPTIONS": a flag on the command line changes no
  process-wide environment variable, so JVMs can be started from parallel threads. When the user has set
  JAVA_TOOL_OPTIONS we add nothing, so their settings apply.
* A py4j socket read timeout (``call_timeout_s``): a JVM call slower than that raises, i.e. counts as a crash.

The env talks to the server object directly, so the package's Python wrapper class is never built.

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


def start_jvm(java_heap_mb: int, call_timeout_s: float) -> Jvm:
    """Launch a ScienceWorld JVM and connect to it."""
    from py4j.java_gateway import CallbackServerParameters, GatewayParameters, JavaGateway, launch_gateway
    from scienceworld.constants import BASEPATH, JAR_PATH

    quiet_py4j_logging()
    javaopts = []
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
