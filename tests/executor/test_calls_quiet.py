"""A call given up on that ends in error in its thread (fenced off when another worker
took the run, say) is not logged as an error nobody retrieved: the worker's log would
show a traceback for what is ordinary (seen in tests/store/test_faults.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
from typing import Any

from saga.errors import LeaseLostError
from saga.executor import calls


def _unretrieved(wrap: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: seen.append(ctx))
        thread: concurrent.futures.Future[Any] = concurrent.futures.Future()
        given_up = wrap(asyncio.wrap_future(thread))
        thread.set_exception(LeaseLostError("r"))
        await asyncio.sleep(0.05)  # the copy to the loop's future, then its callbacks
        del given_up
        gc.collect()

    asyncio.run(main())
    return seen


def test_a_given_up_call_ending_in_error_is_not_logged() -> None:
    assert _unretrieved(lambda f: f) != []  # what asyncio does unasked (else: no test)
    assert _unretrieved(calls.quiet) == []
