"""The engines' prompt cache (prompting.PromptCache): the same text and token ids as rendering every
time, for every prompt a profile or the chat route builds, with the checkpoint's real processor."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from reward_protocol.score import BackendKwargs
from reward_server.engines.io import ChatPrompt, ImagePart, TextPart, Turn, VideoPart
from reward_server.engines.prompting import PromptCache, load_processor, render
from reward_server.profiles import load_profile


@pytest.fixture(scope="module")
def processor(tiny_checkpoint):
    return load_processor(tiny_checkpoint)


def curve_chats(profile_name: str, points: int) -> list[ChatPrompt]:
    profile = load_profile(profile_name)
    video = np.zeros((16, 56, 56, 3), np.uint8)
    requests = profile.build_curve("open the drawer", video, BackendKwargs(score_mode="logprob"), "logprob", points)
    return [r.chat for r in requests]


@pytest.mark.parametrize("profile_name", ["qwen2_5_vl_vllm", "PRIMO-R1"])
def test_cached_prompts_are_the_rendered_ones(processor, profile_name):
    cache = PromptCache(processor)
    chats = curve_chats(profile_name, 8) + curve_chats(profile_name, 8)  # each point twice
    for chat in chats:
        text = cache.text(chat)
        assert text == render(processor, chat)
        assert cache.token_ids(text) == processor.tokenizer.encode(text, add_special_tokens=False)
    assert len({cache.text(c) for c in chats}) == len(set(chats)) > 1  # points differ by their clips
    assert cache.hits() >= len(chats)  # the second curve came from the cache


def test_prompts_differ_where_their_chats_do(processor):
    cache = PromptCache(processor)
    base = ChatPrompt(system="judge", user=(VideoPart(), TextPart("did it open the drawer?")))
    others = [
        ChatPrompt(system="judge", user=(VideoPart(), TextPart("did it close the drawer?"))),
        ChatPrompt(system=None, user=base.user),
        ChatPrompt(system="judge", user=(ImagePart(0), VideoPart(), TextPart("did it open the drawer?"))),
        ChatPrompt(system="judge", user=base.user, history=(Turn("assistant", (TextPart("maybe"),)),)),
    ]
    texts = {cache.text(c) for c in [base, *others]}
    assert len(texts) == 5
    assert cache.text(base) == render(processor, base)


@pytest.mark.parametrize("value", [[{"name": "x"}], True, 1])  # a list cannot be hashed; True == 1
def test_chats_with_template_kwargs_render_every_time(processor, value):
    cache = PromptCache(processor)
    chat = ChatPrompt(system=None, user=(TextPart("hi"),), template_kwargs=(("flag", value),))
    assert cache.text(chat) == render(processor, chat)
    assert cache.text(chat) == render(processor, chat)
    assert cache.hits() == 0


def test_a_template_that_reads_the_clock_is_not_cached(processor):
    calls = []

    def apply_chat_template(messages, **kwargs):
        calls.append(messages)
        return f"rendered {len(calls)}"

    clocked = SimpleNamespace(
        chat_template="{{ strftime_now('%d %b %Y') }}",
        tokenizer=processor.tokenizer,
        apply_chat_template=apply_chat_template,
    )
    cache = PromptCache(clocked)
    chat = ChatPrompt(system=None, user=(TextPart("hi"),))
    assert not cache.caches_text
    assert [cache.text(chat), cache.text(chat)] == ["rendered 1", "rendered 2"]


def test_token_ids_are_a_new_list_each_time(processor):
    cache = PromptCache(processor)
    first = cache.token_ids("hello there")
    first.append(-1)  # vLLM may change what it is handed
    assert cache.token_ids("hello there") == processor.tokenizer.encode("hello there", add_special_tokens=False)


def test_the_cache_keeps_at_most_its_size(processor):
    cache = PromptCache(processor, size=4)
    chats = [ChatPrompt(system=None, user=(TextPart(f"task {i}"),)) for i in range(10)]
    for chat in chats:
        assert cache.token_ids(cache.text(chat)) == processor.tokenizer.encode(
            render(processor, chat), add_special_tokens=False
        )
    assert cache._text.cache_info().currsize == cache._ids.cache_info().currsize == 4
    assert cache.text(chats[0]) == render(processor, chats[0])  # evicted, rendered again
