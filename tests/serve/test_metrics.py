"""The operator's view: /metrics in Prometheus' text format, read back with prometheus_client's own
parser, counting what the requests really did; /v1/models with each member's context length and the
ensemble's. In-process on two tiny random-weight members."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from specfuse.config import EnsembleConfig
from specfuse.engine import Scheduler
from specfuse.serve.api import create_app

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def api(tiny_members):
    members = tiny_members[:2]
    scheduler = Scheduler(members, EnsembleConfig(segment_len=2, max_new_tokens=4), batch_size=2, join_wait=0)
    try:
        with TestClient(create_app(scheduler, api_key="sesame")) as client:
            client.headers["Authorization"] = "Bearer sesame"
            yield client, members
    finally:
        scheduler.close()


def scrape(client) -> dict[tuple[str, tuple], float]:
    got = client.get("/metrics")
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(got.text)
        for sample in family.samples
    }


def test_metrics_count_requests_by_status_tokens_rounds_and_member_seconds(api):
    client, members = api
    before = scrape(client)
    gated = {"gate": True, "gate_threshold": -100.0}  # the gatekeeper is always sure enough
    answers = [
        client.post(
            CHAT,
            json={"model": "specfuse", "messages": [{"role": "user", "content": q}], "max_tokens": 4} | extra,
        )
        for q, extra in (("hello there", {}), ("what is two and two?", {"specfuse": gated}))
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert client.post(CHAT, json={"model": "specfuse", "messages": []}).status_code == 400
    assert (
        client.post(
            CHAT, json={"model": "nobody", "messages": [{"role": "user", "content": "x"}]}
        ).status_code
        == 404
    )
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    after = scrape(client)

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    chat = "/v1/chat/completions"
    assert grew("specfuse_requests_total", endpoint=chat, status="200") == 2
    assert grew("specfuse_requests_total", endpoint=chat, status="400") == 1
    assert grew("specfuse_requests_total", endpoint=chat, status="404") == 1
    assert grew("specfuse_requests_total", endpoint="/v1/models", status="401") == 1
    usage = [a.json()["usage"] for a in answers]
    assert grew("specfuse_completion_tokens_total") == sum(u["completion_tokens"] for u in usage)
    assert grew("specfuse_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage)
    assert grew("specfuse_rounds_total") == sum(a.json()["specfuse"]["rounds"] for a in answers)
    gated_rounds = [a.json()["specfuse"]["gated_rounds"] for a in answers]
    assert gated_rounds[0] == 0 < gated_rounds[1] and grew("specfuse_gated_rounds_total") == sum(gated_rounds)
    for m in members:
        assert grew("specfuse_member_seconds_total", member=m.name, phase="draft") > 0
    assert after[("specfuse_waiting", ())] == 0 and after[("specfuse_running", ())] == 0
    assert after[("specfuse_reading", ())] == 0
    assert after[("specfuse_batch_size", ())] == 2 and after[("specfuse_ready", ())] == 1
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_models_list_each_members_context_length_and_the_ensembles(api):
    client, members = api
    rows = {row["id"]: row for row in client.get("/v1/models").json()["data"]}
    for m in members:
        assert rows[m.name]["context_length"] == rows[m.name]["max_model_len"] == m.max_positions
    assert rows["specfuse"]["context_length"] == min(m.max_positions for m in members)
