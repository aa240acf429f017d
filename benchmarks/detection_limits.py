"""What no rule can do on this traffic: the evidence behind the targets docs/detection.md
leaves unmet.

    python benchmarks/detection_limits.py [--seeds 10]

1. **12x-average loops within 60 s on bursty keys.** The busiest window of a production
   key's normal traffic (``detection_scenarios.production``, 28 days), as a multiple of the
   key's average per minute with idle time included, for windows of 60 s, 10 and 60
   minutes. A loop at 12x the average is told apart only over windows whose busiest normal
   value is below 12x.

2. **A 12x loop within 15 s on a quiet key.** The best any test on call counts can do when a
   legitimate surge to 6x must pass: Page's CUSUM of the log-likelihood ratio of a Poisson
   rate of 12 against 6 times the key's calls per minute (the optimal sequential test for
   that change), with its threshold set just above the largest value the statistic reaches
   over ``--seeds`` 6x surges of one hour (the surge's first hour, before any baseline could
   learn it) or of two days (the benchmark's legitimate surge), in the best of worlds:
   calls independent (Poisson), their sizes drawn from the same law in the loop and in the
   surge (so amounts add no evidence), and the threshold tuned on the very surges it is
   scored on. The table gives the median time to refuse the benchmark's 12x loop (calls at
   a steady pace on top of the key's own). Real traffic is burstier than Poisson, which
   only lengthens these times.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from bisect import bisect_left

from detection_scenarios import DAY, MINUTE, production

SURGE = 2 * DAY


def busiest(mean: float, seed: int = 0, days: float = 28.0) -> list[float]:
    """The busiest 60 s, 10 min and 60 min of ``days`` of production traffic, each as a
    multiple of the traffic's average per minute (idle time included)."""
    calls = [(t, amount) for t, amount, _ in production(random.Random(seed), 0.0, days * DAY, mean)]
    average = sum(amount for _, amount in calls) / (days * DAY / MINUTE)
    times = [t for t, _ in calls]
    prefix = [0.0]
    for _, amount in calls:
        prefix.append(prefix[-1] + amount)
    out = []
    for window in (60.0, 600.0, 3_600.0):
        best = 0.0
        for i, t in enumerate(times):  # windows ending at each call
            j = bisect_left(times, t - window + 1e-9)
            best = max(best, prefix[i + 1] - prefix[j])
        out.append(best / (window / MINUTE) / average)
    return out


def _cusum_peak(rng: random.Random, calls_per_minute: float, seconds: float) -> float:
    """The largest value the CUSUM (12x against 6x) reaches on Poisson calls at 6x."""
    rate = 6 * calls_per_minute / MINUTE  # calls per second under the surge
    step = math.log(2.0)  # log-likelihood ratio per call: ln(12 / 6)
    drift = 6 * calls_per_minute / MINUTE  # (12 - 6) x calls per second, per second
    t = statistic = peak = 0.0
    while t < seconds:
        gap = rng.expovariate(rate)
        t += gap
        statistic = max(0.0, statistic - drift * gap) + step
        peak = max(peak, statistic)
    return peak


def _cusum_delay(rng: random.Random, calls_per_minute: float, threshold: float) -> float:
    """Seconds until the CUSUM passes ``threshold`` on the benchmark's 12x loop: the key's
    own Poisson calls plus a loop calling every ``60 / (11 x calls_per_minute)`` s from a
    random phase."""
    every = MINUTE / (11 * calls_per_minute)
    background = calls_per_minute / MINUTE
    step = math.log(2.0)
    drift = 6 * calls_per_minute / MINUTE
    looped, own = rng.uniform(0, every), rng.expovariate(background)
    t = statistic = 0.0
    while statistic < threshold:
        gap = min(looped, own) - t
        t += gap
        if looped <= own:
            looped += every
        else:
            own += rng.expovariate(background)
        statistic = max(0.0, statistic - drift * gap) + step
    return t


def fastest(calls_per_minute: float, seconds: float, seeds: int) -> tuple[float, float]:
    """(threshold, median seconds to refuse a 12x loop) for the best count test that lets
    ``seeds`` 6x surges of ``seconds`` each pass."""
    rng = random.Random(11)
    peaks = [_cusum_peak(rng, calls_per_minute, seconds) for _ in range(seeds)]
    threshold = max(peaks) + 1e-9
    delays = [_cusum_delay(rng, calls_per_minute, threshold) for _ in range(201)]
    return threshold, statistics.median(delays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="surges per call rate")
    args = parser.parse_args()
    print("| key | busiest 60 s | 10 min | 60 min |")
    print("|---|---|---|---|")
    for mean in (1_000, 15_000, 60_000):
        minute, ten, hour = busiest(mean)
        print(f"| {mean:,}/min | {minute:.0f}x | {ten:.1f}x | {hour:.1f}x |")
    print()
    print("| key's calls per minute | 12x loop refused after (a 1-hour surge passes) "
          "| (a 2-day surge passes) |")  # fmt: skip
    print("|---|---|---|")
    for calls in (3, 10, 20, 30, 60):
        hour = fastest(calls, 3_600.0, args.seeds)
        days = fastest(calls, SURGE, args.seeds)
        print(f"| {calls} | {hour[1]:.0f} s (threshold {hour[0]:.1f}) "
              f"| {days[1]:.0f} s (threshold {days[0]:.1f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
