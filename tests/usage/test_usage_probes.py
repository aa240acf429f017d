"""A stream's markers found through a rare byte (probes), and the search for errors shared by
the usage reader and the failure-loop watch: the same answers as plain ``find``."""

from __future__ import annotations

import random

import pytest

from tokenfuse._usage.accumulator import Accumulator
from tokenfuse._usage.lines import NdjsonFramer
from tokenfuse._usage.providers import GEMINI, OPENAI, OPENAI_RESPONSES
from tokenfuse._usage.scan import ERROR, PROBE_MISSES, ErrorFind, probed_find, probes_of
from tokenfuse._usage.sse import SseFramer


def test_probes_are_the_upper_case_letters_of_a_marker_first_each() -> None:
    assert probes_of(b"[DONE]") == ((b"D", 1), (b"O", 2), (b"N", 3), (b"E", 4))
    assert probes_of(b'"finishReason"') == ((b"R", 7),)
    assert probes_of(b"ABA") == ((b"A", 0), (b"B", 1))
    assert probes_of(b"message_stop") == ()


@pytest.mark.parametrize("marker", [b"[DONE]", b'"finishReason"', b"DD", b"AXB"])
def test_a_probed_find_is_find_for_any_bytes(marker: bytes) -> None:
    """Random bytes of the marker's own letters (probes everywhere, the marker cut, overlapping
    and at both ends): the same answer as ``find``, and busy only past the misses allowed."""
    rng = random.Random(7)
    alphabet = [*sorted(set(marker)), ord(" ")]
    for length in [*range(12), 50, 200, 2_000]:
        for _ in range(40):
            data = bytes(rng.choice(alphabet) for _ in range(length))
            if rng.random() < 0.3:
                where = rng.randrange(length + 1)
                data = data[:where] + marker + data[where:]
            for probe, offset in probes_of(marker):
                at, busy = probed_find(data, marker, probe, offset)
                assert at == data.find(marker), (data, probe)
                end = at + offset if at >= 0 else len(data)
                if busy:
                    assert data.count(probe, offset, end) > PROBE_MISSES, (data, probe)
                else:
                    assert data.count(probe, offset, end) <= PROBE_MISSES, (data, probe)


def _first_of_interest(acc: Accumulator, region: bytes) -> int:
    """What ``first_of_interest`` must answer: the first of plain finds."""
    scanner = acc._scanner
    hits = [region.find(ERROR), scanner.valued_at(region)]
    hits += [region.find(marker) for marker, _ in scanner.markers]
    return min((at for at in hits if at >= 0), default=-1)


@pytest.mark.parametrize("shape", [OPENAI, OPENAI_RESPONSES, GEMINI], ids=lambda s: s.missing_hint)
def test_first_of_interest_is_the_first_hit_of_plain_finds_while_probes_wear_out(shape) -> None:  # type: ignore[no-untyped-def]
    """Regions full of the probes' letters (each probe in turn made busy, then the markers
    searched whole) with a marker or none: every answer is plain ``find``'s."""
    rng = random.Random(3)
    acc = Accumulator(shape, "p", estimate=True)
    letters = [b"D", b"O", b"N", b"E", b"R", b"[DONE", b"x", b"\n\n", b'"finishReason'] * 3
    markers = [b"[DONE]", b'"finishReason"', b"error", b"response.failed", b""]
    for _ in range(200):
        region = b"".join(rng.choice(letters) for _ in range(rng.randrange(400)))
        where = rng.randrange(len(region) + 1)
        region = region[:where] + rng.choice(markers) + region[where:]
        assert acc.first_of_interest(region) == _first_of_interest(acc, region), region
    assert acc._probing is not None and any(acc._probing)  # the probes wore out as meant


def test_done_is_seen_after_batches_that_wore_out_its_probes() -> None:
    """Text heavy with the letters of ``[DONE]`` (an id of such letters repeated in every
    event), then ``[DONE]`` alone in the last batch: the end is seen, so a stream closed right
    after it is not partial."""
    acc = Accumulator(OPENAI, "openai", estimate=True)
    framer = SseFramer(acc)
    event = b'data: {"id":"DONE-NODE","choices":[{"delta":{"content":"END OF DOC"}}]}\n\n'
    for _ in range(5):
        framer.feed(event * 400)
    framer.feed(b"data: [DONE]\n\n")
    usage = acc.result(complete=False)
    assert usage.estimated and not usage.partial


def test_done_only_in_the_first_batch_is_seen() -> None:
    acc = Accumulator(OPENAI, "openai", estimate=True)
    framer = SseFramer(acc)
    framer.feed(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n')
    for _ in range(3):
        framer.feed(b'data: {"choices":[{"delta":{"content":"DO NOT"}}]}\n\n' * 50)
    assert acc.end_seen


def test_an_error_find_searches_each_object_once_for_two_looks() -> None:
    searched: list[bytes] = []

    class Counted(bytes):
        def find(self, *args: object) -> int:  # type: ignore[override]
            searched.append(self)
            return super().find(*args)  # type: ignore[arg-type]

    errors = ErrorFind()
    one, other = Counted(b'data: {"error": 1}'), Counted(b"data: {}")
    assert [errors.at(one), errors.at(one), errors.at(other)] == [8, 8, -1]
    assert searched == [one, other]  # the same object again: no search
    assert errors.at(other) == -1 and errors._data == b""  # both have looked: let go
    assert errors.at(one) == 8 and searched == [one, other, one]  # asked again: searched
    assert ErrorFind().at(b"") == -1


@pytest.mark.parametrize("framer_type", [SseFramer, NdjsonFramer])
def test_the_error_a_framer_gives_is_where_find_sees_it_however_the_chunks_are_cut(
    framer_type: type[SseFramer] | type[NdjsonFramer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framer finds ``ERROR`` in the chunk it is fed (the search it shares with the watch,
    which may look before or after it) and works out where it is in the records it reads: in
    what it held, across the seam, in the chunk, or past the records' end. Every answer is
    plain ``find``'s on those records, and the stream reads as it would alone."""
    given: list[int | None] = []
    plain = Accumulator.first_of_interest

    def checked(self: Accumulator, region: bytes, error: int | None = None) -> int:
        assert error is None or error == region.find(ERROR), (region, error)
        given.append(error)
        return plain(self, region, error)

    monkeypatch.setattr(Accumulator, "first_of_interest", checked)
    rng = random.Random(11)
    parts = [b"data: ", b"error", b"err", b"or", b"\n", b"\n\n", b"\r\n", b"\r", b"x" * 7]
    parts += [b'data: {"error": 1}\n\n', b"event: error\n", b'{"usage": {"total_tokens": 3}}']
    for _ in range(400):
        body = b"".join(rng.choice(parts) for _ in range(rng.randrange(60)))
        cuts = sorted(rng.sample(range(1, len(body)), min(max(len(body) - 1, 0), rng.randrange(8))))
        chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        shared, alone = Accumulator(OPENAI, "p"), Accumulator(OPENAI, "p")
        shared.errors = errors = ErrorFind()
        framer, framer_alone = framer_type(shared), framer_type(alone)
        for chunk in chunks:
            watch_first = rng.random() < 0.5
            if watch_first:
                errors.at(chunk)
            framer.feed(chunk)
            framer_alone.feed(chunk)
            if not watch_first:
                errors.at(chunk)
        framer.close(True)
        framer_alone.close(True)
        assert (shared.errored, shared.counts) == (alone.errored, alone.counts), body
    assert sum(1 for error in given if error is not None and error > 0) > 100
