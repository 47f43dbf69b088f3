"""The drive's wait for its first task to end (calls.Wakeup), against asyncio.wait."""

from __future__ import annotations

import asyncio

import pytest

from saga.executor.calls import Wakeup


async def _after(seconds: float, value: str) -> str:
    await asyncio.sleep(seconds)
    return value


def test_returns_what_has_ended_once_one_has() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        slow = wakeup.watch(asyncio.ensure_future(_after(10, "slow")))
        fast = wakeup.watch(asyncio.ensure_future(_after(0, "fast")))
        also = wakeup.watch(asyncio.ensure_future(_after(0, "also")))
        done = await wakeup.first_done([slow, fast, also])
        assert done == [fast, also]  # both ended in the same turn, in the order given
        expected, _ = await asyncio.wait({slow, fast, also},
                                         return_when=asyncio.FIRST_COMPLETED)
        assert set(done) == expected
        slow.cancel()
    asyncio.run(main())


def test_a_task_not_waited_for_does_not_end_the_wait() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        other = wakeup.watch(asyncio.ensure_future(_after(0, "other")))
        waited = wakeup.watch(asyncio.ensure_future(_after(0.05, "waited")))
        assert await wakeup.first_done([waited]) == [waited]
        assert other.done()  # it ended first, and woke the wait, which went on waiting
    asyncio.run(main())


def test_ended_already_returns_at_once_and_a_cancelled_wait_leaves_no_trace() -> None:
    async def main() -> None:
        wakeup = Wakeup()
        ended = wakeup.watch(asyncio.ensure_future(_after(0, "x")))
        await ended
        assert await wakeup.first_done([ended]) == [ended]
        errors: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(
            context))
        running = wakeup.watch(asyncio.ensure_future(_after(10, "y")))
        waiter = asyncio.ensure_future(wakeup.first_done([running]))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        running.cancel()  # its callback finds the wait cancelled, and does nothing
        await asyncio.sleep(0.01)
        assert errors == []  # (setting a cancelled wait's result would be reported here)
    asyncio.run(main())


def test_a_task_that_wakes_the_wait_as_it_ends_is_found_done() -> None:
    async def main() -> None:
        wakeup = Wakeup()

        async def ending() -> str:
            await asyncio.sleep(0)
            wakeup.wake()  # before its callback could: the wait resumes a turn sooner
            return "done"

        order: list[str] = []
        task = asyncio.ensure_future(ending())
        task.add_done_callback(lambda _: order.append("its callbacks"))
        wakeup.watch(task)
        slow = wakeup.watch(asyncio.ensure_future(_after(10, "slow")))
        assert await wakeup.first_done([task, slow]) == [task]
        order.append("the wait resumed")
        await asyncio.sleep(0)
        # Woken by the task itself, the wait resumes before the task's callbacks run.
        assert order == ["the wait resumed", "its callbacks"]
        assert task.result() == "done"
        slow.cancel()
    asyncio.run(main())
