"""A throwaway PostgreSQL cluster of a test's own, on a free port, that the test may stop,
restart and cut connections of (never the shared server on 5432).

PostgreSQL refuses to run as root, so when the tests run as root the cluster is run as
the ``postgres`` user, its data directory in a temporary directory that user owns.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bin() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (Debian's layout, or the PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One cluster: ``start()``, ``stop()``, ``restart()``, ``kill_backends()``."""

    def __init__(self) -> None:
        bindir = pg_bin()
        if bindir is None:
            raise FileNotFoundError("initdb")
        self.bin = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="saga-pg-", dir="/tmp"))
        self.data = self.dir / "data"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            pw = pwd.getpwnam(self.user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._as_owner([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                        "-U", "postgres", "--no-sync", "-E", "UTF8"])

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=60)

    def _ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "30",
                               *args], check=check)

    def start(self) -> None:
        # fsync off: the OS never crashes under these tests, only the server does.
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=100")
        self._ctl("-o", options, "-l", str(self.dir / "log"), "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def kill_backends(self) -> int:
        """Terminate every other client connection (``pg_terminate_backend``); how many."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchall()
        return len(rows)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self._ctl("-m", "immediate", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
