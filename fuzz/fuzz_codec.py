"""atheris (libFuzzer) harness for the wire codec's decoder.

    python -m fuzz.corpus --write-corpus fuzz/corpus_dir
    python fuzz/fuzz_codec.py -atheris_runs=200000 fuzz/corpus_dir

Each input is one `Message` payload (no length prefix). It is verified with
`codec.decode`; if accepted, every accessor of the view is read (union tags,
fields, vectors, structs, PCM buffers, the nested TDLG snapshot) and
`to_dict()` is called. CodecError (MalformedMessage / UnknownMessageType) is
the expected outcome for bad input; any other exception, a crash, a hang or an
out-of-memory is a finding (libFuzzer writes the input to crash-<sha1>).

Note: the codec is a compiled Cython extension; `instrument_imports` only
instruments Python bytecode, so coverage feedback from inside the C walk is
not available unless the extension is rebuilt with -fsanitize=fuzzer-no-link.
To compensate, a structure-aware custom mutator (fuzz.corpus.mutate: offset
and vtable-aware overwrites, truncation, splicing of seeds) is mixed with
libFuzzer's own byte-level mutations.
"""
import os
import random
import sys

import atheris

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

with atheris.instrument_imports():
    from tryll_fast import codec
    from fuzz import corpus


def TestOneInput(data: bytes) -> None:
    tag = codec.peek_body_type(data)          # must never raise
    if not isinstance(tag, int):
        raise AssertionError(f"peek_body_type returned {tag!r}")
    try:
        msg = codec.decode(data)
    except codec.CodecError:
        return
    try:
        corpus.read_everything(msg)
    except codec.CodecError:
        # Reads are bounds-checked a second time; a typed error is acceptable.
        return


def CustomMutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if data and rng.random() < 0.6:
        out = corpus.mutate(data, rng)
    else:
        out = atheris.Mutate(data, max_size)
    return out[:max_size]


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput, custom_mutator=CustomMutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
