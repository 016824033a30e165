"""Hostile phones over HTTP (issue 55's targets), against the app served in a process of its own
(studio.room_drill, as the room benchmark serves it) through the real /join page: a 1 MB vote, a
vote for no candidate (both refused in one short line, the value not repeated), a forged id, a vote
after the reveal and join-code guessing each get a clear refusal on the phone, and the session goes
on for everyone else: their votes are counted."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import httpx
import pytest

from specfuse.bench.room import Phone, Server, drill, page_of
from studio.room import FAILS_PER_CLIENT, RoomError


@pytest.fixture(scope="module")
def server():
    served = Server(queue_size=4)
    try:
        yield served
    finally:
        served.stop()


async def hostile_class(server: Server) -> dict[str, object]:
    with urllib.request.urlopen(server.address + "/config") as answer:
        page = page_of(json.loads(answer.read()))
    async with httpx.AsyncClient(base_url=server.address, timeout=30) as client:
        code = (await drill(client, "/drill/open"))["code"]
        good, big, forger = Phone(client, page), Phone(client, page), Phone(client, page)
        for phone in (good, big, forger):
            await phone.join(code)
        beat = await drill(client, "/drill/step")
        letter = beat["letters"][0]
        assert await big.vote("X" * 1_000_000) is None  # a 1 MB vote
        assert await big.vote("ZZ") is None  # no such candidate
        forger.token = forger.token.split(".")[0] + "." + "0" * 32  # a forged signature
        assert await forger.vote(letter) is None
        counted = await good.vote(letter)
        assert counted is not None and await big.vote(letter) is not None  # the session goes on
        tally = await drill(client, "/drill/tally", "GET")
        await drill(client, "/drill/step")  # the reveal
        after = await good.vote(letter)
        guesser = Phone(client, page)
        for _ in range(FAILS_PER_CLIENT + 1):
            await guesser.join("WRONG1")
        await drill(client, "/drill/end")
        return {
            "big": big.refusals,
            "forger": forger.refusals,
            "good": good.refusals,
            "after": after,
            "counts": tally["counts"],
            "letter": letter,
            "guesser": guesser.refusals,
        }


def test_hostile_phones_are_refused_and_the_class_goes_on(server):
    seen = asyncio.run(hostile_class(server))
    # The room's own refusal, one short line: nothing of the 1 MB value comes back
    assert seen["big"] == [str(RoomError("no_such"))] * 2
    assert seen["forger"] == [str(RoomError("forged"))]
    assert seen["counts"] == {seen["letter"]: 2}  # the good phone's and the big one's honest vote
    assert seen["after"] is None and seen["good"] == [str(RoomError("closed"))]  # after the reveal
    guesses = seen["guesser"]
    assert guesses[:FAILS_PER_CLIENT] == [str(RoomError("no_code"))] * FAILS_PER_CLIENT
    assert guesses[-1] == str(RoomError("guessing"))
