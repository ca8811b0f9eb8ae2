"""Every server-local file a request names is parsed, resolved and opened here, on every route.

A request names a file three ways: `/score`'s `video_path`, a raw batch item's `video_path`, and a
chat request's `file://` URL (`image_url` / `video_url`). Each step that Python's own functions
could fail on hostile text (ValueError for a NUL, UnicodeError for bytes that are not UTF-8,
OSError for a name too long) is checked first or caught, and every failure is a PathError: a 4xx
that says what was wrong and what is allowed (errors.py maps each class), never a 500.

- URL: only `file:///absolute/path` (or `file://localhost/...`), no query or fragment, the path
  percent-decoded as UTF-8; any other scheme is refused (the server fetches nothing).
- Path: at most MAX_PATH_CHARS characters, absolute, no NUL, representable as a file name.
- Resolving: symlinks and '..' are resolved and the result must lie under a `--video-root`.
- Opening: without blocking (a FIFO never waits), without following a link swapped in since,
  only a regular file, and the opened descriptor is checked against the roots again.

Messages name only what the client sent, never the server's roots or where a link points.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import SplitResult, unquote, urlsplit

from reward_server.request_errors import FieldError

MAX_PATH_CHARS = 4096
_SHOWN_CHARS = 200  # of a client's path or URL echoed in an error
MediaKind = Literal["video", "image"]

FILE_URL_FORM = "file:///absolute/path under the server's --video-root (percent-encoded UTF-8)"


class PathError(FieldError, ValueError):
    """A path or URL this server will not read; `param` names the request field (chat)."""


class InvalidURL(PathError):
    """Not a URL this server reads (scheme, host, query, percent-encoding)."""


class InvalidPath(PathError):
    """A path that cannot name a file here (relative, NUL, too long), or a file that cannot be read."""


class FileNotFound(PathError):
    """No file at the (allowed) path."""


class FileTooLarge(PathError):
    """The file is larger than the server reads."""


class PathNotAllowed(PathError):
    """The path resolves outside every --video-root, or the server reads no files at all."""


def shown(text: str) -> str:
    """The client's text, quoted and cut short, for an error message."""
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")


def check_path(path: object, what: str = "video_path", param: str | None = None) -> str:
    """`path` if it can name a file here; InvalidPath saying why not."""
    if not isinstance(path, str) or not path:
        raise InvalidPath(f"{what} must be a non-empty absolute path", param)
    if len(path) > MAX_PATH_CHARS:
        raise InvalidPath(f"{what} has {len(path)} characters; the limit is {MAX_PATH_CHARS}", param)
    if "\x00" in path:
        raise InvalidPath(f"{what} {shown(path)} contains a NUL character, which no file name holds", param)
    try:
        os.fsencode(path)
    except UnicodeError:
        raise InvalidPath(f"{what} {shown(path)} is not valid Unicode (a lone surrogate?)", param) from None
    if not os.path.isabs(path):
        raise InvalidPath(f"{what} {shown(path)} is relative; send an absolute path under a --video-root", param)
    return path


def _split(url: str, param: str | None) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for file://[::1/x
        raise InvalidURL(f"malformed URL {shown(url)} ({exc}); send {FILE_URL_FORM}", param) from None


def file_url_path(url: str, param: str | None = None) -> str:
    """The local path a `file:` URL names (checked by check_path), or InvalidURL / InvalidPath."""
    parts = _split(url, param)
    if parts.scheme.lower() != "file":
        raise InvalidURL(f"{shown(url)} is not a file URL; send {FILE_URL_FORM}", param)
    if parts.netloc not in ("", "localhost"):
        raise InvalidURL(f"file URLs must name a local path (file:///path), not host {shown(parts.netloc)}", param)
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise InvalidURL(
            f"file URL {shown(url)} has a query or fragment; a file URL names only a path "
            "(percent-encode '?' as %3F and '#' as %23 in file names)",
            param,
        )
    try:
        path = unquote(parts.path, errors="strict")
    except UnicodeDecodeError:
        raise InvalidURL(f"file URL {shown(url)} percent-encodes bytes that are not UTF-8", param) from None
    return check_path(path, "the file URL's path", param)


def url_scheme(url: str) -> str:
    """The URL's scheme, lower-case ('' when it has none)."""
    head, sep, _ = url.partition(":")
    return head.strip().lower() if sep else ""


def refuse_url(url: str, kind: MediaKind, param: str | None) -> InvalidURL:
    """The error for a media URL that is neither a data: nor a file: URL."""
    example = "data:image/jpeg;base64,..." if kind == "image" else "data:video/mp4;base64,..."
    scheme = url_scheme(url)
    if scheme in ("http", "https"):
        return InvalidURL(
            f"this server does not fetch http(s) URLs; send the {kind} as a data URL ({example}) or {FILE_URL_FORM}",
            param,
        )
    what = f"scheme {scheme!r}" if scheme else "no scheme"
    return InvalidURL(f"unsupported URL ({what}): send a data URL ({example}) or {FILE_URL_FORM}", param)


def _inside(real: str, real_roots: list[str]) -> bool:
    p = Path(real)
    return any(p == Path(r) or Path(r) in p.parents for r in real_roots)


def open_confined(
    path: str,
    roots: Sequence[str | os.PathLike],
    max_bytes: int,
    what: str = "video_path",
    param: str | None = None,
) -> BinaryIO:
    """An open regular file at `path`, which must lie under one of `roots` (PathError otherwise)."""
    if not roots:
        raise PathNotAllowed(
            f"this server reads no files (it has no --video-root); send the media inline instead of a {what}", param
        )
    check_path(path, what, param)
    outside = PathNotAllowed(f"{what} {shown(path)} is outside the directories this server may read", param)
    try:
        real = os.path.realpath(path)
        real_roots = [os.path.realpath(root) for root in roots]
    except (OSError, ValueError):
        raise InvalidPath(f"{what} {shown(path)} cannot be resolved", param) from None
    if not _inside(real, real_roots):
        raise outside
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait; O_NOFOLLOW: the resolved
        # name must not have become a symlink since.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFound(f"{what} {shown(path)} does not exist", param) from None
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or errno.EIO).lower()
        raise InvalidPath(f"{what} {shown(path)} cannot be opened ({reason})", param) from None
    except ValueError:
        raise InvalidPath(f"{what} {shown(path)} cannot be opened", param) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidPath(
                f"{what} {shown(path)} is not a regular file (directories, FIFOs and devices are never read)", param
            )
        if st.st_size > max_bytes:
            raise FileTooLarge(f"{what} {shown(path)} is {st.st_size} bytes; the limit is {max_bytes}", param)
        opened = os.path.realpath(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else real
        if not _inside(opened, real_roots):
            raise outside
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


__all__ = [
    "MAX_PATH_CHARS",
    "FileNotFound",
    "FileTooLarge",
    "InvalidPath",
    "InvalidURL",
    "PathError",
    "PathNotAllowed",
    "check_path",
    "file_url_path",
    "open_confined",
    "refuse_url",
    "url_scheme",
]
