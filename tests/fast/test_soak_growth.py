"""The soak's memory growth figure means the same for a server lifetime of any length (issue 42,
item 6): a server that fills its caches in its first quarter and then holds steady shows no growth
whether it lived 2 minutes or an hour (before: 'the first 10 minutes' against the end, which for
a 2-minute life compared the warm-up with itself plus a bit and reported growth), and a steady
leak shows as growth and as a slope in MiB per hour."""

from __future__ import annotations

import pytest

from reward_tools.soak import lifetime_memory


def life(minutes: float, rss, every_s: float = 5.0) -> tuple[list[dict], list[dict]]:
    """Samples of one lifetime, ready at t=10 s, with rss(seconds since ready) MiB."""
    ready, samples = 10.0, []
    t = ready
    while t <= ready + minutes * 60:
        samples.append({"t": t, "life": 0, "rss_mib": rss(t - ready)})
        t += every_s
    return samples, [{"index": 0, "ready_s": ready, "ended_s": t, "how": "end"}]


def warm_then_flat(span_s: float):
    """Caches fill over the first sixth of the life (1000 -> 1500 MiB), then nothing moves."""
    return lambda x: 1000 + 500 * min(1.0, x / (span_s / 6))


@pytest.mark.parametrize("minutes", [2, 60])
def test_warm_up_then_flat_is_no_growth_at_any_length(minutes):
    samples, lifetimes = life(minutes, warm_then_flat(minutes * 60))
    [entry] = lifetime_memory(samples, lifetimes)
    assert entry["growth_pct"] == 0.0 and abs(entry["slope_mib_per_h"]) < 1, entry


@pytest.mark.parametrize("minutes", [2, 60])
def test_a_leak_is_growth_and_a_slope(minutes):
    leak = 600.0  # MiB per hour, after the warm-up
    base = warm_then_flat(minutes * 60)
    samples, lifetimes = life(minutes, lambda x: base(x) + leak * x / 3600)
    [entry] = lifetime_memory(samples, lifetimes)
    assert entry["growth_pct"] > 0
    assert entry["slope_mib_per_h"] == pytest.approx(leak, rel=0.05), entry


def test_too_short_to_say():
    samples, lifetimes = life(0.2, lambda x: 1000.0)  # 12 s: 3 samples in all
    [entry] = lifetime_memory(samples, lifetimes)
    assert entry["growth_pct"] is None and entry["slope_mib_per_h"] is None
