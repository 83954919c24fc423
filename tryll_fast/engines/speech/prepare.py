"""Fetch-time preparation of a Piper voice: one ONNX graph edit, written beside the original.

A Piper VITS graph returns audio only, and draws its two noise tensors inside the graph
(RandomNormalLike), so the same sentence sounds different every time and the durations it
chose for each phoneme are lost. The prepared graph (`PREPARED_NAME`):

- returns the duration predictor's per-phoneme frame counts (the `Ceil` node's output) as
  a second output, so visemes are timed by the very run that made the audio;
- takes the noise as inputs `noise_w` [1, 2, >= phonemes] and `noise_z` [1, 192, >=
  frames], sliced in the graph to the length each run needs, so the engine seeds them per
  sentence: the same sentence in the same voice is the same audio (cacheable, testable,
  and a throttled server speaks exactly what an unthrottled one would).

It runs once per fetch (`tryll-fast models fetch`, DownloadModel), about a second, with the
`onnx` package; the engine refuses an unprepared voice.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

PREPARED_NAME = "voice.prepared.onnx"
# Names of the inserted graph inputs (the engine feeds them).
NOISE_W, NOISE_Z = "noise_w", "noise_z"
DURATIONS = "durations"


def prepare_piper(main_file: Path, progress: Callable[[float], None] | None = None) -> Path:
    """Write the prepared graph of `main_file` beside it; returns its path. `progress`
    gets the fraction done (0..1) after each step."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise RuntimeError("preparing a Piper voice needs the onnx package") from exc
    report = progress or (lambda fraction: None)
    model = onnx.load(str(main_file))
    report(0.4)
    graph = model.graph
    noise_nodes = [n for n in graph.node if n.op_type == "RandomNormalLike"]
    ceil_nodes = [n for n in graph.node if n.op_type == "Ceil"]
    if len(noise_nodes) != 2 or len(ceil_nodes) != 1:
        raise ValueError(f"{main_file.name}: not a Piper VITS graph (expected 2 "
                         f"RandomNormalLike and 1 Ceil node, found {len(noise_nodes)} and "
                         f"{len(ceil_nodes)})")
    for node in noise_nodes:
        # the duration predictor's noise lives under /dp/; the other one feeds the flow
        name = NOISE_W if node.name.startswith("/dp/") else NOISE_Z
        channels = 2 if name == NOISE_W else "channels"
        like, out = node.input[0], node.output[0]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        # out = noise[:, :, :T] where T comes from the tensor the noise was "like"
        replacement = [
            helper.make_node("Shape", [like], [f"{name}/shape"], name=f"{name}/Shape"),
            helper.make_node("Shape", [f"{name}/shape"], [f"{name}/rank"],
                             name=f"{name}/Rank"),
            helper.make_node("ConstantOfShape", [f"{name}/rank"], [f"{name}/starts"],
                             name=f"{name}/Starts",
                             value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
            helper.make_node("Slice", [name, f"{name}/starts", f"{name}/shape"], [out],
                             name=f"{name}/Slice"),
        ]
        for k, new in enumerate(replacement):
            graph.node.insert(at + k, new)
        graph.input.append(helper.make_tensor_value_info(
            name, TensorProto.FLOAT, [1, channels, f"{name}_length"]))
    ceil = ceil_nodes[0]
    graph.node.append(helper.make_node("Identity", [ceil.output[0]], [DURATIONS],
                                       name="durations/Identity"))
    graph.output.append(helper.make_tensor_value_info(DURATIONS, TensorProto.FLOAT,
                                                      [1, 1, "phonemes"]))
    onnx.checker.check_model(model)
    report(0.7)
    out = main_file.parent / PREPARED_NAME
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(model.SerializeToString())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    report(1.0)
    return out
