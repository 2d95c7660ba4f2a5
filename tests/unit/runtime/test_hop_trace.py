"""runtime/hop_trace.py on real files: which offsets are sampled, what a stamp writes,
a fetch answer's batches read for their offsets, GC pauses logged through gc.callbacks."""

from __future__ import annotations

import gc
from pathlib import Path

from protocol.record_batch import encode_batch
from runtime import hop_trace
from runtime.hop_trace import HopTracer


def lines(tracer: HopTracer) -> list[list[str]]:
    return [line.split() for line in tracer.path.read_text().splitlines()]


def test_offsets_are_sampled_alike_in_every_process(tmp_path: Path) -> None:
    tracer = HopTracer(tmp_path, "t", sample=10)
    try:
        assert list(tracer.sampled(0, 25)) == [0, 10, 20]
        assert list(tracer.sampled(11, 19)) == []
        assert list(tracer.sampled(19, 30)) == [20, 30]
        tracer.stamp("leader.append", "t1", 2, 5, 21, at=123)
        hops = [parts for parts in lines(tracer) if parts[0] == "hop"]
        assert hops == [
            ["hop", "leader.append", "t1", "2", "10", "123"],
            ["hop", "leader.append", "t1", "2", "20", "123"],
        ]
    finally:
        tracer.close()


def test_a_fetch_answer_is_stamped_by_its_batch_offsets(tmp_path: Path) -> None:
    tracer = HopTracer(tmp_path, "t", sample=2)
    try:
        data = encode_batch([(None, b"a")] * 3, base_offset=7) + encode_batch(
            [(None, b"b")], base_offset=10
        )
        tracer.stamp_batches("consumer.fetched", "t1", 0, data)
        assert [int(p[4]) for p in lines(tracer) if p[0] == "hop"] == [8, 10]
    finally:
        tracer.close()


def test_gc_pauses_are_logged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hop_trace, "GC_LOG_MIN_NS", 0)
    tracer = HopTracer(tmp_path, "t")
    try:
        gc.collect()
        pauses = [p for p in lines(tracer) if p[0] == "gc"]
        assert pauses and pauses[-1][1] == "2" and int(pauses[-1][3]) > 0
    finally:
        tracer.close()
    assert tracer._on_gc not in gc.callbacks


def test_off_unless_the_directory_is_given(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hop_trace, "TRACER", None)
    monkeypatch.delenv(hop_trace.TRACE_DIR_ENV, raising=False)
    assert hop_trace.enable_from_environment("t") is None
    monkeypatch.setenv(hop_trace.TRACE_DIR_ENV, str(tmp_path / "d"))
    tracer = hop_trace.enable_from_environment("t")
    try:
        assert tracer is not None and tracer.path.parent == tmp_path / "d"
        assert hop_trace.enable_from_environment("other") is tracer
    finally:
        tracer.close()


def test_a_directory_that_cannot_be_made_leaves_tracing_off(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hop_trace, "TRACER", None)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(hop_trace.TRACE_DIR_ENV, str(blocker / "sub"))
    assert hop_trace.enable_from_environment("t") is None
