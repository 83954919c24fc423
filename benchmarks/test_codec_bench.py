"""Codec: ours vs the official FlatBuffers runtime (flatc --python), same run.

decode = verify + decode a frame + read every field; encode = build the frame
from values. Gates: codec_decode_vs_flatbuffers / codec_encode_vs_flatbuffers
(geometric mean over the mix of median(official) / median(ours))."""
import pytest

from benchmarks.codec_mix import MIX, ref_encoder
from tryll_fast import codec as c

NAMES = list(MIX)


@pytest.mark.parametrize("impl", ["ours", "flatbuffers"])
@pytest.mark.parametrize("name", NAMES)
def test_decode(benchmark, name, impl):
    value_fn, _, ours_read, ref_read = MIX[name]
    frame = c.encode(value_fn())
    benchmark.group = f"decode {name}"
    benchmark.extra_info.update(suite="codec", op="decode", msg=name, impl=impl)
    result = benchmark(ours_read if impl == "ours" else ref_read, frame)
    assert result


@pytest.mark.parametrize("impl", ["ours", "flatbuffers"])
@pytest.mark.parametrize("name", NAMES)
def test_encode(benchmark, name, impl):
    value_fn = MIX[name][0]
    expected = c.encode(value_fn())
    benchmark.group = f"encode {name}"
    benchmark.extra_info.update(suite="codec", op="encode", msg=name, impl=impl)
    if impl == "ours":
        frame = benchmark(lambda: c.encode(value_fn()))
    else:
        frame = benchmark(ref_encoder(name))
    # both sides must produce the very same frame, or the comparison is void
    assert frame == expected
