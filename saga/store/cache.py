"""The tool-result cache (seed 002's ``cache: seconds``): a completed call's output, reused
by later runs for the same tool and parameters until it expires.

Entries live in ``saga_cache`` beside the events. A hit is recorded in the step's
``StepCompleted`` with the run that produced the output, so the history still says where
every output came from. With payloads encrypted at rest (:mod:`saga.store.encryption`) an
entry's output is sealed with the data key of the run that produced it (a shredded run's
entries read as misses).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from saga.chain import canonical
from saga.store.encryption import SEALED_KEY, open_value, seal_value, sealer_for
from saga.store.side_tables import Database

CACHE_DDL = ("""CREATE TABLE IF NOT EXISTS saga_cache (
    key TEXT PRIMARY KEY, tool TEXT NOT NULL, run_id TEXT NOT NULL, step_id TEXT NOT NULL,
    output TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)""",)


def cache_key(tool: str, parameters: Any) -> str:
    """What identifies a call: the tool and its canonical parameters."""
    return hashlib.sha256(tool.encode() + b"\0" + canonical(parameters)).hexdigest()


class ToolCache:
    """Cached tool outputs in one store."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        self._sealer = sealer_for(db.settings)
        db.create(CACHE_DDL)

    def get(self, tool: str, parameters: Any) -> dict[str, Any] | None:
        """``{"output", "run_id", "step_id", "key"}`` of a live entry, or None."""
        key = cache_key(tool, parameters)
        rows = self.db.query("SELECT run_id, step_id, output FROM saga_cache "
                             "WHERE key = ? AND expires_at > ?", (key, self.clock()))
        if not rows:
            return None
        row = rows[0]
        output = json.loads(row["output"])
        if isinstance(output, dict) and SEALED_KEY in output:
            if self._sealer is None:
                return None  # sealed, and no key configured here: as if not cached
            plain = open_value(self._sealer, row["run_id"], f"cache|{key}", output)
            if plain is None:  # the producing run was shredded
                return None
            output = json.loads(plain)
        return {"output": output, "run_id": row["run_id"],
                "step_id": row["step_id"], "key": key}

    def put(self, tool: str, parameters: Any, output: Any, run_id: str, step_id: str,
            seconds: float) -> None:
        """Remember an output for ``seconds``."""
        key = cache_key(tool, parameters)
        stored = json.dumps(output) if self._sealer is None else \
            seal_value(self._sealer, run_id, f"cache|{key}", json.dumps(output).encode())
        self.db.execute(
            "INSERT INTO saga_cache (key, tool, run_id, step_id, output, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id,"
            " step_id = excluded.step_id, output = excluded.output, "
            "expires_at = excluded.expires_at",
            (key, tool, run_id, step_id, stored, self.clock() + seconds))
