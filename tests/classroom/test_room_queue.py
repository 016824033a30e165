"""serve_room (studio.room_page): a class's burst of events never reads "Queue is full", the runs'
bound still holds, and every phone gets a worker slot. On a real Gradio server over HTTP: a run
(concurrency 1) holds the worker, a second waits (the bound, 1, is reached); then 30 students'
events (no concurrency limit, as /join's) go in at once; a third run is refused as before. Without
serve_room the same students are refused: what the test guards."""

from __future__ import annotations

import asyncio

import gradio as gr
import httpx

from studio.room import MAX_PHONES
from studio.room_page import GRADIO_SLOTS, serve_room

from ..conftest import free_port


def app() -> tuple[gr.Blocks, asyncio.Event]:
    release = asyncio.Event()

    async def run(x: str) -> str:
        await release.wait()  # a run holding the worker until the test lets it go
        return x

    async def student(x: str) -> str:
        return x

    with gr.Blocks() as demo:
        box, out = gr.Textbox(), gr.Textbox()
        gr.Button("run").click(run, box, out, concurrency_limit=1, api_name="run")
        gr.Button("join").click(student, box, out, concurrency_limit=None, api_name="join")
    return demo, release


async def burst(address: str, fns: dict[str, int]) -> dict[str, list[int]]:
    async with httpx.AsyncClient(base_url=address, timeout=30) as client:

        async def push(fn: int, n: int) -> int:
            body = {"data": ["x"], "fn_index": fn, "session_hash": f"s{fn}-{n}", "event_data": None}
            return (await client.post("/gradio_api/queue/join", json=body)).status_code

        first = [await push(fns["run"], 0), await push(fns["run"], 1)]  # one runs, one waits
        await asyncio.sleep(0.3)
        students = await asyncio.gather(*(push(fns["join"], n) for n in range(30)))
        late_run = await push(fns["run"], 2)
        return {"first": first, "students": list(students), "late_run": [late_run]}


def served(room: bool) -> dict[str, list[int]]:
    demo, release = app()
    demo.queue(max_size=1, default_concurrency_limit=1)
    extra = serve_room(demo) if room else {}
    _, address, _ = demo.launch(
        server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **extra
    )
    try:
        fns = {fn.api_name: fn._id for fn in demo.fns.values() if fn.api_name in ("run", "join")}
        codes = asyncio.run(burst(address.rstrip("/"), fns))
        if room:
            assert demo.max_threads == GRADIO_SLOTS + MAX_PHONES
            assert len(demo._queue.active_jobs) == GRADIO_SLOTS + MAX_PHONES
        return codes
    finally:
        release.set()
        demo.close()


def test_a_burst_of_students_goes_in_while_the_runs_bound_holds():
    codes = served(room=True)
    assert codes["first"] == [200, 200]
    assert codes["students"] == [200] * 30  # none of them "Queue is full"
    assert codes["late_run"] == [503]  # the runs' bound (--queue-size) is kept


def test_without_it_the_students_read_queue_full():
    codes = served(room=False)
    assert codes["first"] == [200, 200]
    assert 503 in codes["students"]
