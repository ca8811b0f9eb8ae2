"""errors.py's one table of error types: each class answers with its own row (no base class
listed earlier shadows it), and docs/api.md lists every type (tests/test_packaging.py checks
that the page is generated from the table)."""

from __future__ import annotations

import pytest

from reward_server.errors import ERROR_TYPES, classify

ROWS = [(e.type, e.status, cls) for e in ERROR_TYPES for cls in e.classes]


@pytest.mark.parametrize(("kind", "status", "cls"), ROWS, ids=[f"{r[2].__name__}" for r in ROWS])
def test_each_error_class_answers_with_its_own_type(kind, status, cls):
    exc = cls.__new__(cls)
    exc.args = ("what was wrong",)
    answered, error = classify(exc)
    assert (answered, error.type) == (status, kind)


def test_types_are_unique_and_named_for_what_failed():
    types = [e.type for e in ERROR_TYPES]
    assert len(types) == len(set(types))
    # the inputs a request names each have their own types (issue 31: a chat image or a JSON body
    # over a limit was `video_too_large`, a dead worker `invalid_video`)
    for kind in ("invalid_url", "invalid_path", "file_not_found", "path_not_allowed", "body_too_large",
                 "image_too_large", "invalid_image", "video_too_large", "invalid_video", "worker_died"):  # fmt: skip
        assert kind in types


def test_a_client_stalling_its_body_is_not_a_server_timeout():
    from reward_server.request_errors import BodyTimeout

    assert not issubclass(BodyTimeout, TimeoutError)  # a generic TimeoutError -> 504 handler never sees it
    assert classify(BodyTimeout("stalled"))[0] == 408
