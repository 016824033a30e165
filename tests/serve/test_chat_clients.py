"""Conversations from clients nobody here wrote (issue 44): simonw's `llm` CLI with a system prompt
(-s) and a continued conversation (-c), and lm-evaluation-harness's few-shot chat evaluation
(--apply_chat_template --fewshot_as_multiturn), against a live server on loopback with the tiny
members. What each client really sent is read off the wire (helpers_clients.Recorder): the system
message and the earlier turns arrive as separate messages, and the answers equal the engine's for the
same messages (fp32 greedy). The official openai client's system + three turns, whole and streamed,
and hostile conversations: tests/serve/test_conversations.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specfuse.config import EnsembleConfig
from specfuse.engine import Ensemble, Scheduler

from ..helpers_clients import GSM8K, Recorder, api_on, gsm8k_task, run_lm_eval

BASE = EnsembleConfig(segment_len=5, max_new_tokens=16, temperature=0.0)
LLM = shutil.which("llm", path=str(Path(sys.executable).parent))  # simonw's llm, from requirements-dev


@pytest.fixture(scope="module")
def server(tiny_members):
    with api_on(Scheduler(tiny_members, BASE, batch_size=4, queue=16), wrap=Recorder) as served:
        yield served


def engine_answer(members, messages, **changes) -> str:
    return Ensemble(members).run(messages, replace(BASE, **changes)).answer


def llm_cli(home: Path, *args: str) -> str:
    """`llm ARGS...` with its user directory (keys, logs, extra models) in `home`; its stdout."""
    env = {**os.environ, "LLM_USER_PATH": str(home), "OPENAI_API_KEY": "", "NO_COLOR": "1"}
    done = subprocess.run([LLM, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(LLM is None, reason="needs simonw's llm (requirements-dev.txt)")
@pytest.mark.slow
def test_the_llm_cli_sends_its_system_prompt_and_earlier_turns_as_messages(server, tiny_members, tmp_path):
    url, recorder = server
    home = tmp_path / "llm"
    home.mkdir()
    # llm's way to add an OpenAI-compatible model: extra-openai-models.yaml in its user directory.
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: specfuse-tiny\n  model_name: specfuse\n  api_base: {url}/v1\n", encoding="utf-8"
    )
    assert "specfuse-tiny" in llm_cli(home, "models", "list")
    system = "You are a terse assistant. Answer in one sentence."
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour of the sea."}]
    said = llm_cli(home, "-m", "specfuse-tiny", "-s", system, first[1]["content"])  # streamed
    assert recorder.chats()[-1] == first
    assert said == engine_answer(tiny_members, first) + "\n"
    # -c continues the last conversation: llm sends it whole again, its answer as the assistant's turn.
    second = [*first, {"role": "assistant", "content": said[:-1]}, {"role": "user", "content": "Why?"}]
    again = llm_cli(home, "-c", "--no-stream", "Why?")
    assert recorder.chats()[-1] == second
    assert again == engine_answer(tiny_members, second) + "\n"
    third = [*second, {"role": "assistant", "content": again[:-1]}, {"role": "user", "content": "Shorter."}]
    assert llm_cli(home, "-c", "Shorter.") == engine_answer(tiny_members, third) + "\n"
    assert recorder.chats()[-1] == third
    logged = json.loads(llm_cli(home, "logs", "-n", "3", "--json"))
    assert [r["prompt"] for r in logged] == ["Name a colour of the sea.", "Why?", "Shorter."]
    assert len({r["conversation_id"] for r in logged}) == 1 and logged[0]["system"] == system


@pytest.mark.skipif(not GSM8K.is_file(), reason="needs the GSM8K development slice in ../shared/data")
@pytest.mark.slow
def test_lm_eval_scores_a_few_shot_task_with_the_shots_as_earlier_turns(server, tiny_members, tmp_path):
    url, recorder = server
    name = "specfuse_gsm8k_fewshot"
    task = gsm8k_task(tmp_path / "task", name, rows=2, shots=2, shortest=True)  # 512-token contexts
    out = tmp_path / "out"
    before = len(recorder.chats())
    instruction = "Reply with a number."
    done = run_lm_eval(
        url,
        task,
        name,
        out,
        *("--num_fewshot", "2", "--fewshot_as_multiturn", "--limit", "2"),
        *("--system_instruction", instruction),
        concurrent=2,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # its score table: the task's row, two shots, its exact match
    assert re.search(rf"^\|{name}\s*\|\s*1\|flexible-extract\|\s*2\|exact_match\|", done.stdout, re.M)
    (results,) = out.rglob("results_*.json")
    assert "exact_match,flexible-extract" in json.loads(results.read_text())["results"][name]
    chats = recorder.chats()[before:]
    assert len(chats) == 2
    shots = [json.loads(line) for line in (task / "shots.jsonl").read_text(encoding="utf-8").splitlines()]
    for messages in chats:
        # a system message, two shots as user/assistant turns, then the question: six messages
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert messages[0]["content"] == instruction
        for user, assistant in zip(messages[1:5:2], messages[2:5:2]):
            shot = next(s for s in shots if user["content"] == f"Question: {s['question']}\nAnswer:")
            assert assistant["content"] == shot["answer"].split("#### ")[-1]
    (samples,) = out.rglob(f"samples_{name}_*.jsonl")
    for sample in map(json.loads, samples.read_text().splitlines()):
        (sent,) = sample["arguments"]["gen_args_0"]["arg_0"]  # the messages as lm-eval logs them, JSON
        messages = json.loads(sent)
        assert messages in chats
        want = engine_answer(tiny_members, messages, max_new_tokens=12, stop_strings=("Question:",))
        assert sample["resps"][0][0] == want
