"""The real vLLM CPU engine behind the Ray pool (tiny random-weight model: the text is noise,
the mechanics are real). Routing and failure handling are also checked without vLLM."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from mdd.engines.base import EngineError, Message, Request, Sampling

SYSTEM = (
    "你是一名经验丰富的精神科医生，正在对患者进行初诊问诊。请依次询问睡眠、情绪、兴趣、食欲、"
    "精力、注意力、自我评价、自杀观念、焦虑、躯体症状、既往史、家族史和个人史。"
)


def _msgs(*pairs: tuple[str, str]) -> tuple[Message, ...]:
    return tuple(Message(r, c) for r, c in pairs)  # type: ignore[arg-type]


@pytest.mark.vllm
async def test_plain_generation(vllm_engine):
    c = await vllm_engine.generate(
        Request(messages=_msgs(("system", SYSTEM), ("user", "你好，医生。")),
                sampling=Sampling(max_tokens=24, seed=1), session="plain")
    )
    assert c.text
    assert c.prompt_tokens > 10
    assert 1 <= c.output_tokens <= 24
    assert c.finish_reason in {"stop", "length"}
    assert vllm_engine.model.endswith("mdd-tiny") or "tiny" in vllm_engine.model


@pytest.mark.vllm
async def test_choice_structured_output(vllm_engine):
    choices = ("是", "否")
    reqs = [
        Request(messages=_msgs(("system", SYSTEM), ("user", f"这个话题结束了吗？({seed})")),
                sampling=Sampling(temperature=1.0, max_tokens=8, seed=seed, choice=choices),
                session=f"choice-{seed}")
        for seed in range(6)
    ]
    outs = await asyncio.gather(*(vllm_engine.generate(r) for r in reqs))
    assert all(o.text in choices for o in outs), [o.text for o in outs]


@pytest.mark.vllm
async def test_json_schema_bounded(vllm_engine):
    schema = {
        "type": "object",
        "properties": {"end": {"type": "boolean"}, "topic": {"type": "string", "maxLength": 8}},
        "required": ["end", "topic"],
    }
    c = await vllm_engine.generate(
        Request(messages=_msgs(("system", SYSTEM), ("user", "用JSON回答。")),
                sampling=Sampling(temperature=0.7, max_tokens=48, seed=3, json_schema=schema),
                session="json")
    )
    assert c.output_tokens <= 48
    if c.finish_reason == "stop":  # a random model may run out of tokens (whitespace): parse only when done
        assert isinstance(json.loads(c.text), dict)


@pytest.mark.vllm
async def test_sessions_stick_to_their_engine(vllm_engine):
    seen: dict[str, set[int]] = {"a": set(), "b": set()}
    for turn in range(2):
        for s in seen:
            seen[s].add(vllm_engine.engine_for(f"stick-{s}"))
            await vllm_engine.generate(
                Request(messages=_msgs(("system", SYSTEM), ("user", f"第{turn}轮")),
                        sampling=Sampling(max_tokens=4, seed=turn), session=f"stick-{s}")
            )
    assert all(len(v) == 1 for v in seen.values())
    stats = vllm_engine.engine_stats()
    assert len(stats) == len(vllm_engine.actors) and sum(s["requests"] for s in stats) >= 4


@pytest.mark.vllm
async def test_prefix_cache_hits_grow(vllm_engine):
    # long enough to fill several KV blocks; a unique opening so no earlier test shares it
    history = [("system", f"[{time.time_ns()}] " + SYSTEM * 12), ("user", "医生你好，我最近睡不好。")]
    first = await vllm_engine.generate(
        Request(messages=_msgs(*history), sampling=Sampling(max_tokens=16, seed=7), session="cache")
    )
    before = await vllm_engine.ametrics()
    history += [("assistant", first.text), ("user", "而且总是早醒，白天没精神。")]
    second = await vllm_engine.generate(
        Request(messages=_msgs(*history), sampling=Sampling(max_tokens=16, seed=8), session="cache")
    )
    assert second.prompt_tokens > first.prompt_tokens
    # the first prompt is reused whole blocks at a time (its answer's blocks too when the answer's text
    # tokenizes back to the tokens generated, which the random-weight model's text often does not: the
    # block holding the prompt's end and the answer's start is then computed again)
    stats = await vllm_engine.aengine_stats()
    # configs/local-vllm.yaml as vLLM resolved it: not the CPU build's default block of 128, and
    # the KV cache in fp8
    assert {s["block_size"] for s in stats} == {32}
    assert {s["kv_cache_dtype"] for s in stats} == {"fp8_e4m3"}
    assert second.cached_tokens >= first.prompt_tokens // 32 * 32 > 0
    after = before
    for _ in range(20):  # vLLM records its counters just after returning the output
        after = await vllm_engine.ametrics()
        if after["prefix_cache_hits"] > before["prefix_cache_hits"]:
            break
        await asyncio.sleep(0.1)
    assert after["prefix_cache_hits"] > before["prefix_cache_hits"]
    assert after["prefix_cache_queries"] >= before["prefix_cache_queries"] + second.prompt_tokens
    for k in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "output_tokens"):
        assert k in after
    # the counters come from vLLM's own Prometheus metrics, not our per-request fallback
    assert {s.get("prefix_cache_source") for s in await vllm_engine.aengine_stats()} == {"vllm"}


@pytest.mark.vllm
async def test_engine_threads_follow_the_batch(vllm_engine):
    # configs/local-vllm.yaml: 2 threads from 16 requests in flight, 1 thread at 8 or fewer
    before = (await vllm_engine.aengine_stats())[0]
    reqs = [Request(messages=_msgs(("system", SYSTEM), ("user", f"第{i}个问题")),
                    sampling=Sampling(max_tokens=24, seed=i), session=f"threads-{i}") for i in range(24)]
    await asyncio.gather(*(vllm_engine.generate(r) for r in reqs))
    for _ in range(50):  # the last change is sent as the last request leaves
        after = (await vllm_engine.aengine_stats())[0]
        if after["threads"] == 1:
            break
        await asyncio.sleep(0.1)
    # up to 2 when the batch filled, back to 1 when it drained: vLLM's worker ran both changes
    assert after["thread_switches"] >= before["thread_switches"] + 2
    assert after["threads"] == 1 and after["in_flight"] == 0


# ---- routing and failure handling, no vLLM needed ----------------------------------------


def test_piece_tokenizer_matches_whole_prompt_encoding(tiny_model_dir):
    from transformers import AutoTokenizer

    from mdd.engines.vllm import PieceTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir / "tokenizer"))
    pieces = PieceTokenizer(tok)
    assert pieces.split is not None  # the self-check passed for the chat tokenizer
    history = [{"role": "system", "content": SYSTEM * 3}]
    for turn in range(6):
        history += [{"role": "user", "content": f"第{turn}轮：最近睡不好 ，\n\n【下一步】问 sleep。"},
                    {"role": "assistant", "content": f"好的 {turn}！还有呢？ "}]
        text = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
        assert pieces.encode(text) == list(tok.encode(text, add_special_tokens=False))
    # append-only prompts: each call encodes only its new messages
    assert pieces.hits > pieces.misses


class _SpacePrefixing:
    """A tokenizer whose pieces do not compose (it marks the start of every encode call)."""

    added_tokens_decoder: dict = {}
    all_special_tokens = ["<s>"]

    def apply_chat_template(self, messages, **_):
        return "".join(f"<s>{m['content']}" for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [0] + [ord(c) for c in text]


def test_piece_tokenizer_falls_back_when_pieces_do_not_compose():
    from mdd.engines.vllm import PieceTokenizer

    pieces = PieceTokenizer(_SpacePrefixing())
    assert pieces.split is None
    assert pieces.encode("<s>ab<s>c") == [0] + [ord(c) for c in "<s>ab<s>c"]


def test_new_sessions_go_to_least_loaded_engine():
    from mdd.engines.vllm import VLLMPoolEngine

    pool = VLLMPoolEngine([object(), object(), object()], "m")
    first = [pool.engine_for(f"s{i}") for i in range(3)]
    assert sorted(first) == [0, 1, 2]  # spread
    assert [pool.engine_for(f"s{i}") for i in range(3)] == first  # sticky
    pool.end_session("s0")
    assert pool.engine_for("s3") == first[0]  # the freed engine is the least loaded
    pool._inflight[1] += 5  # busy calls count as load too
    pool.end_session("s1")
    pool.end_session("s2")
    assert pool.engine_for("s4") != 1


def test_pool_pickles_without_routing_state():
    import pickle

    from mdd.engines.vllm import VLLMPoolEngine

    pool = VLLMPoolEngine(["h0", "h1"], "m")
    pool.engine_for("x")
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.actors == ["h0", "h1"] and clone.model == "m" and not clone._sticky


async def test_dead_engine_raises_engine_error_and_unsticks(ray_session):
    import ray

    from mdd.engines.vllm import VLLMPoolEngine

    @ray.remote(num_cpus=0)
    class Fake:
        def __init__(self, tag):
            self.tag = tag

        async def generate(self, messages, sampling, rid, session="", role=""):
            return {"text": self.tag, "prompt_tokens": 1, "output_tokens": 1,
                    "cached_tokens": 0, "finish_reason": "stop"}

        def stats(self):
            return {"in_flight": 0}

    a, b = Fake.remote("a"), Fake.remote("b")
    pool = VLLMPoolEngine([a, b], "fake", stats_refresh_s=1e9)
    req = Request(messages=_msgs(("user", "hi")), session="dlg")
    first = await pool.generate(req)
    dead = pool.engine_for("dlg")
    ray.kill(pool.actors[dead], no_restart=True)
    for _ in range(100):  # the kill is asynchronous: wait until the actor is gone
        try:
            ray.get(pool.actors[dead].stats.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            break
        await asyncio.sleep(0.1)
    with pytest.raises(EngineError):
        await pool.generate(req)
    assert "dlg" not in pool._sticky
    retry = await pool.generate(req)  # the retry lands on the live engine
    assert retry.text != first.text
    for h in (a, b):
        ray.kill(h, no_restart=True)


async def test_thread_policy_follows_load_with_hysteresis():
    from mdd.engines.vllm import ThreadPolicy

    sent: list[int] = []

    async def apply(n: int) -> int:
        sent.append(n)
        return n

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    p = ThreadPolicy(2, 16, apply)
    assert p.current == 0  # as started, until the first change
    p.update(1)
    await settle()
    assert (p.current, sent) == (1, [1])
    for load in range(2, 16):
        p.update(load)
    await settle()
    assert p.current == 1
    p.update(16)
    await settle()
    assert (p.current, sent) == (2, [1, 2])
    for load in (15, 12, 9):  # above half the threshold: stays
        p.update(load)
    await settle()
    assert p.current == 2
    p.update(8)
    await settle()
    assert (p.current, sent, p.switches) == (1, [1, 2, 1], 3)
    # a change requested while one is in the air is applied when it lands
    p.update(20)
    p.update(3)
    await settle()
    assert p.current == 1 and sent[-2:] == [2, 1]


async def test_thread_policy_off_without_cpu_threads_or_after_a_failure():
    from mdd.engines.vllm import ThreadPolicy

    async def fail(n: int) -> int:
        raise RuntimeError("no such method")

    off = ThreadPolicy(None, 16, fail)
    off.update(100)
    assert off.pending is None and off.current is None
    broken = ThreadPolicy(2, 4, fail)
    broken.update(10)
    for _ in range(5):
        await asyncio.sleep(0)
    assert broken.high is None and broken.pending is None
    broken.update(1)
    assert broken.pending is None


async def test_a_finished_dialogue_ends_its_session_on_its_engine(ray_session):
    import ray

    from mdd.cases import load_cases
    from mdd.config import load_config
    from mdd.synthesize.worker import DialogueWorker
    from mdd.engines.vllm import VLLMPoolEngine

    @ray.remote(num_cpus=0)
    class Recorder:
        def __init__(self):
            self.sessions, self.ended = set(), []

        async def generate(self, messages, sampling, rid, session="", role=""):
            self.sessions.add(session)
            choice = sampling.get("choice")
            text = choice[0] if choice else ('{"covered": []}' if sampling.get("json_schema") else "嗯。")
            return {"text": text, "prompt_tokens": 3, "output_tokens": 1, "cached_tokens": 0, "finish_reason": "stop"}

        def end_session(self, session, finished=True):
            self.ended.append((session, finished))

        def seen(self):
            return sorted(self.sessions), self.ended

        def stats(self):
            return {"in_flight": 0}

    actor = Recorder.remote()
    pool = VLLMPoolEngine([actor], "rec", stats_refresh_s=1e9)
    cfg = load_config(None)
    case = load_cases(cfg.synth.cases)[0][0]
    worker = DialogueWorker({case.case_id: case}, pool, cfg.synth.dialogue, 1)
    res = await worker.run(case.case_id, 0)
    sessions, ended = await actor.seen.remote()
    ray.kill(actor, no_restart=True)
    assert res["ok"] and sessions == [res["row"]["dialogue_id"]]
    assert ended == [(res["row"]["dialogue_id"], True)] and not pool._sticky
