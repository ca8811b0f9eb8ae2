"""OpenAI chat clients against the real engines on the tiny checkpoint: the official `openai` client,
the seed's ManiSkill reward worker's exact payload and parse, and RLinf's API reward worker's
shape (many concurrent single requests, sampling parameters spread into the body, `/health`).
Random weights write noise, so what is asserted is the protocol: statuses, shape, usage counts,
that every frame reached the model as an image (prompt tokens), and errors for bad input.

The servers are the session's shared ones (tests/conftest.py), so this module starts none of
its own when the other engine tests run too."""

from __future__ import annotations

import base64
import concurrent.futures as cf

import httpx
import openai
import pytest

from reward_client.video_io import encode_mp4
from reward_tools.bench_chat import frame, history_payload, jpeg_data_url, seed_payload
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import get, post

CHAT = "/v1/chat/completions"
# a 256x256 frame lands on 252x252: (252 / 28)^2 = 81 merged patches, plus vision start / end
TOKENS_PER_FRAME = 81 + 2


def model_of(url: str) -> str:
    r = get(f"{url}/v1/models")
    assert r.status_code == 200, r.text
    (card,) = r.json()["data"]
    return card["id"]


def chat(url: str, body: dict) -> httpx.Response:
    return post(f"{url}{CHAT}", json=body, timeout=300)


def test_official_openai_client_on_vllm(vllm_server, tiny_checkpoint):
    model = model_of(vllm_server.url)
    assert model == tiny_checkpoint.rstrip("/").rsplit("/", 1)[-1]  # RLinf's derivation of the name
    client = openai.OpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    assert [m.id for m in client.models.list()] == [model]
    image = {"type": "image_url", "image_url": {"url": jpeg_data_url(frame(1, 0), 70)}}
    out = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You judge robot rollouts."},
            {"role": "user", "content": [image, image, {"type": "text", "text": "Did it work?"}]},
        ],
        temperature=0,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
    )
    (choice,) = out.choices
    assert out.object == "chat.completion" and out.model == model and out.id.startswith("chatcmpl-")
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    assert 1 <= out.usage.completion_tokens <= 4
    assert out.usage.prompt_tokens > 2 * TOKENS_PER_FRAME
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    tokens = choice.logprobs.content
    assert len(tokens) == out.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in tokens)
    assert tokens[0].top_logprobs[0].logprob >= tokens[0].top_logprobs[1].logprob
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], stream=True)
    assert err.value.body["param"] == "stream" and "not built" in err.value.body["message"]


def test_seed_worker_payload_frames_reach_the_model_as_images(vllm_server):
    """The seed's worker: 8 JPEG frames + the [[SCORE]] question, temperature 0, max_tokens 16;
    it reads choices[0].message.content and takes the number in [[...]] (noise here: 0.0)."""
    model = model_of(vllm_server.url)
    usage = {}
    for k in (2, 8):
        payload = seed_payload(model, [frame(k, t) for t in range(k)])
        r = chat(vllm_server.url, payload)
        assert r.status_code == 200, r.text
        body = r.json()
        text = body["choices"][0]["message"]["content"]
        assert 1 <= body["usage"]["completion_tokens"] <= 16
        usage[k] = body["usage"]["prompt_tokens"]
        # temperature 0: the same episode sent again gets the same answer, so the same reward from
        # the worker's parse (seed_score); unseeded sampling is random (test_chat_semantics.py)
        assert chat(vllm_server.url, payload).json()["choices"][0]["message"]["content"] == text
    # the same text, six more frames: exactly six more images' tokens in the prompt
    assert usage[8] - usage[2] == 6 * TOKENS_PER_FRAME


def test_rlinf_api_worker_shape_many_concurrent_requests(vllm_server):
    """RLinf's EmbodiedAPIRewardWorker: one request per sample from a thread pool, 5 frames of 2
    views each, `reward.api.sampling_params` spread into the body, /health checked first."""
    assert get(f"{vllm_server.url}/health").status_code == 200
    model = model_of(vllm_server.url)
    sampling = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 4, "seed": 0, "skip_special_tokens": True}
    bodies = [
        history_payload(model, [[frame(2 * i + v, t) for t in range(5)] for v in range(2)], sampling) for i in range(12)
    ]
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: chat(vllm_server.url, b), bodies))
    assert [a.status_code for a in answers] == [200] * len(bodies), [a.text for a in answers if a.status_code != 200]
    prompt_tokens = {a.json()["usage"]["prompt_tokens"] for a in answers}
    assert len(prompt_tokens) == 1 and prompt_tokens.pop() > 10 * TOKENS_PER_FRAME
    assert get(f"{vllm_server.url}/health").status_code == 200


def test_sampling_controls_on_vllm(vllm_server):
    model = model_of(vllm_server.url)
    base = {"model": model, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6}
    seeded = [chat(vllm_server.url, {**base, "temperature": 1.0, "seed": 7}).json() for _ in range(2)]
    assert seeded[0]["choices"][0]["message"]["content"] == seeded[1]["choices"][0]["message"]["content"]
    r = chat(vllm_server.url, {**base, "temperature": 1.0, "allowed_token_ids": [40], "logprobs": True})
    assert r.status_code == 200, r.text
    tokens = r.json()["choices"][0]["logprobs"]["content"]
    # one token forced; its log-probabilities are the model's raw ones (test_chat_semantics.py)
    assert len({t["token"] for t in tokens}) == 1 and all(t["logprob"] < 0 for t in tokens)


def test_video_url_and_bad_input_on_vllm(vllm_server, video_dir):
    model = model_of(vllm_server.url)
    mp4 = encode_mp4(episode_frames(20, size=64), fps=10)
    (video_dir / "chat_episode.mp4").write_bytes(mp4)
    for url in (f"data:video/mp4;base64,{base64.b64encode(mp4).decode()}", f"file://{video_dir / 'chat_episode.mp4'}"):
        part = {"type": "video_url", "video_url": {"url": url}}
        # a few tokens: the server's 4000-token limit at its 10 ms step floor would be 40 s a request
        body = {"model": model, "messages": [{"role": "user", "content": [part]}], "max_tokens": 4}
        r = chat(vllm_server.url, body)
        assert r.status_code == 200, r.text
    bad = [
        ({"image_url": {"url": "https://example.com/a.jpg"}, "type": "image_url"}, 400, "invalid_url"),
        ({"image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}, "type": "image_url"}, 400, "invalid_image"),
    ]
    for part, status, code in bad:
        r = chat(vllm_server.url, {"model": model, "messages": [{"role": "user", "content": [part]}]})
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    # a prompt longer than the model's context: the engine refuses it, the client gets a 400
    long_text = " ".join(f"word{i}" for i in range(6000))
    r = chat(vllm_server.url, {"model": model, "messages": [{"role": "user", "content": long_text}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "input_rejected", r.text
    assert chat(vllm_server.url, seed_payload(model, [frame(0, t) for t in range(8)])).status_code == 200


def test_transformers_engine_renders_the_same_prompt(hf_server, vllm_server):
    """The same seed payload through both engines: the same prompt tokens (images included)."""
    usage = {}
    for name, server in (("hf", hf_server), ("vllm", vllm_server)):
        model = model_of(server.url)
        payload = seed_payload(model, [frame(3, t) for t in range(8)])
        payload["max_tokens"] = 3
        r = chat(server.url, payload)
        assert r.status_code == 200, r.text
        usage[name] = r.json()["usage"]
        assert 1 <= usage[name]["completion_tokens"] <= 3
    assert usage["hf"]["prompt_tokens"] == usage["vllm"]["prompt_tokens"]
    client = openai.OpenAI(base_url=f"{hf_server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    out = client.chat.completions.create(
        model=model_of(hf_server.url),
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
        stop=["\n"],
    )
    assert len(out.choices[0].logprobs.content) >= 1
    with pytest.raises(openai.BadRequestError) as err:  # not in transformers' generate
        client.chat.completions.create(
            model=model_of(hf_server.url), messages=[{"role": "user", "content": "x"}], presence_penalty=0.5
        )
    assert err.value.body["param"] == "presence_penalty" and "--engine vllm" in err.value.body["message"]


def test_top_k_chat_beside_logprob_scoring_keeps_both_answers(vllm_server):
    """vLLM gathers log-probabilities by token id for a whole step once one request in it names
    ids (the logprob score mode), so a top-k chat request in that step would get padding instead
    of its alternatives. Sent at once, each still gets what it asked for: every chat token has 3
    distinct alternatives, the chosen (greedy) one first, and every score equals the same
    episode's score sent alone."""
    model = model_of(vllm_server.url)
    episodes = [
        {
            "task_text": "put the bowl on the plate",
            "frames": inline(episode_frames(8, seed=s)),
            "backend_kwargs": {"score_mode": "logprob"},
        }
        for s in range(4)
    ]
    alone = [post(f"{vllm_server.url}/score", json=e, timeout=300).json()["score"] for e in episodes]
    body = seed_payload(model, [frame(2, t) for t in range(2)])
    body.update(temperature=0, max_tokens=3, ignore_eos=True, logprobs=True, top_logprobs=3)
    with cf.ThreadPoolExecutor(8) as pool:
        chats = [pool.submit(chat, vllm_server.url, body) for _ in range(4)]
        scores = [pool.submit(post, f"{vllm_server.url}/score", json=e, timeout=300) for e in episodes]
        chats = [f.result() for f in chats]
        scores = [f.result() for f in scores]
    for r in chats:
        assert r.status_code == 200, r.text
        for token in r.json()["choices"][0]["logprobs"]["content"]:
            top = token["top_logprobs"]
            assert len({(t["token"], t["logprob"]) for t in top}) == 3 and all(t["logprob"] > -1e4 for t in top), top
            assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True), top
            assert top[0]["token"] == token["token"] and top[0]["logprob"] == pytest.approx(token["logprob"], abs=1e-4)
    assert [r.json()["score"] for r in scores] == pytest.approx(alone, abs=1e-3)
