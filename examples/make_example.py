"""Write the example model used by the README quickstart: a small conv stem followed by a transformer-style
MLP block, so that both Ascend layout families show up (NC1HWC0 / FRACTAL_Z around the convolutions,
FRACTAL_NZ around the MatMuls) with the conversions between them.

    python examples/make_example.py example.onnx [--batch N | --dynamic-batch]

Weights are random with a fixed seed; the model is a valid ONNX opset-17 model that onnxruntime runs.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(batch: int | str = 1, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(name, *shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else shape[0])
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        w("stem.w", 32, 3, 3, 3), numpy_helper.from_array(np.zeros(32, np.float32), "stem.b"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 32).astype(np.float32), "bn.scale"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32) * 0.1, "bn.bias"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32) * 0.1, "bn.mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 32).astype(np.float32), "bn.var"),
        w("conv2.w", 64, 32, 3, 3), numpy_helper.from_array(np.zeros(64, np.float32), "conv2.b"),
        numpy_helper.from_array(np.array([0, 64, 256], np.int64), "tokens.shape"),
        w("mlp.fc1.w", 64, 128), numpy_helper.from_array(np.zeros(128, np.float32), "mlp.fc1.b"),
        w("mlp.fc2.w", 128, 64), numpy_helper.from_array(np.zeros(64, np.float32), "mlp.fc2.b"),
        numpy_helper.from_array(np.ones(64, np.float32), "ln.scale"),
        numpy_helper.from_array(np.zeros(64, np.float32), "ln.bias"),
        w("head.w", 64, 10), numpy_helper.from_array(np.zeros(10, np.float32), "head.b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "stem.w", "stem.b"], ["stem"], name="stem/Conv",
                         kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["stem", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"],
                         name="stem/BatchNorm"),
        helper.make_node("Relu", ["bn"], ["relu1"], name="stem/Relu"),
        helper.make_node("Conv", ["relu1", "conv2.w", "conv2.b"], ["conv2"], name="down/Conv",
                         kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="down/Relu"),
        helper.make_node("Reshape", ["relu2", "tokens.shape"], ["flat"], name="tokens/Reshape"),
        helper.make_node("Transpose", ["flat"], ["tokens"], name="tokens/Transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["tokens", "mlp.fc1.w"], ["fc1"], name="mlp/fc1/MatMul"),
        helper.make_node("Add", ["fc1", "mlp.fc1.b"], ["fc1b"], name="mlp/fc1/Add"),
        helper.make_node("Relu", ["fc1b"], ["act"], name="mlp/Relu"),
        helper.make_node("MatMul", ["act", "mlp.fc2.w"], ["fc2"], name="mlp/fc2/MatMul"),
        helper.make_node("Add", ["fc2", "mlp.fc2.b"], ["fc2b"], name="mlp/fc2/Add"),
        helper.make_node("Add", ["fc2b", "tokens"], ["res"], name="mlp/Residual"),
        helper.make_node("LayerNormalization", ["res", "ln.scale", "ln.bias"], ["ln"], name="norm/LayerNorm",
                         axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "head.w"], ["head"], name="head/MatMul"),
        helper.make_node("Add", ["head", "head.b"], ["headb"], name="head/Add"),
        helper.make_node("ReduceMean", ["headb"], ["pooled"], name="head/ReduceMean", axes=[1], keepdims=0),
        helper.make_node("Softmax", ["pooled"], ["probs"], name="head/Softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "npu_deploy_example",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 64, 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="npu-deploy-example", producer_version="1")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output", help="path of the .onnx file to write")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--batch", type=int, default=1, help="fixed batch size (default 1)")
    g.add_argument("--dynamic-batch", action="store_true", help="leave the batch dimension symbolic ('N')")
    args = ap.parse_args()
    model = build("N" if args.dynamic_batch else args.batch)
    onnx.save(model, args.output)
    print(f"wrote {args.output}: {len(model.graph.node)} nodes, input x {'[N' if args.dynamic_batch else '[' + str(args.batch)},3,64,64]")


if __name__ == "__main__":
    main()
