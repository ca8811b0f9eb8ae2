"""Episode buffers: bounded memory whatever the episode length, frames spread evenly, last one kept."""

from __future__ import annotations

import numpy as np
import pytest

from reward_client.rlinf.episodes import EpisodeBuffer, EpisodeBuffers


def _frame(step: int, shape=(8, 8, 3)) -> np.ndarray:
    return np.full(shape, step % 251, dtype=np.uint8)


@pytest.mark.parametrize("length", [1, 2, 7, 16, 17, 40, 100, 512, 2000])
def test_frames_spread_over_the_episode_and_end_on_the_last_one(length):
    buf = EpisodeBuffer(16, (8, 8, 3))
    for t in range(length):
        buf.append(_frame(t))
    steps = buf.steps()
    frames = buf.frames()
    assert steps[0] == 0 and steps[-1] == length - 1
    assert steps == sorted(set(steps)) and len(steps) == min(16, length)
    assert [int(f[0, 0, 0]) for f in frames] == [s % 251 for s in steps]  # the right frames, in order
    if length >= 32:
        gaps = np.diff(steps)
        assert gaps.max() <= 2.5 * length / 15  # no stretch of the episode left unseen


def test_memory_is_bounded_by_two_nframes_frames_over_a_512_step_episode():
    shape = (256, 256, 3)
    buf = EpisodeBuffer(16, shape)
    frame_bytes = int(np.prod(shape))
    allocated = buf.nbytes
    for t in range(512):
        buf.append(_frame(t, shape))
        assert buf.nbytes == allocated  # preallocated: nothing grows with the episode
    assert allocated <= 2 * 16 * frame_bytes


def test_buffers_per_env_start_and_skip_finished_envs():
    bufs = EpisodeBuffers(num_envs=3, nframes=4)
    frames = np.stack([_frame(0)] * 3)
    bufs.start([0, 1, 2], frames)
    for t in range(1, 6):
        bufs.append(np.stack([_frame(t)] * 3), active=np.array([True, t < 3, True]))
    assert [bufs.length(e) for e in range(3)] == [6, 3, 6]
    bufs.start([0], np.stack([_frame(100)]))  # env 0 resets: a new episode
    assert bufs.length(0) == 1 and int(bufs.frames(0)[0, 0, 0, 0]) == 100
    assert int(bufs.frames(1)[-1, 0, 0, 0]) == 2  # env 1 stopped recording when it finished


def test_odd_nframes_round_up_like_the_server():
    assert EpisodeBuffer(5, (2, 2, 3)).nframes == 6
    assert EpisodeBuffer(1, (2, 2, 3)).nframes == 2
