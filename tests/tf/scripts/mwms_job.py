"""A two-worker MultiWorkerMirroredStrategy job on one machine, written for no tool.

    python mwms_job.py launch [--steps N] [--out DIR]

Started as ``launch`` it is the launcher: it starts two workers (itself, with
``TF_CONFIG`` naming both on free local ports) and ends with the first failing
worker's status. Each worker trains Keras 2 (``tf_keras``) ``fit`` over its own
``tf.data`` pipeline; worker 1's maps each element serially through heavy work, so it
is the straggler the other waits for in every step's collectives. Prints ``done I``
per worker.
"""

import argparse
import json
import os
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(steps):
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    for index in range(2):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(config)}
        workers.append(subprocess.Popen(
            [sys.executable, __file__, "worker", "--steps", str(steps)], env=env))
    codes = [w.wait() for w in workers]
    sys.exit(next((c for c in codes if c != 0), 0))


def work(steps):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Dense(64, activation="relu", input_shape=(32,)),
            keras.layers.Dense(2),
        ])
        model.compile(keras.optimizers.SGD(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).standard_normal((64 * steps, 32)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")

    def heavy(a, b):
        m = tf.reshape(tf.tile(a, [8]), [16, 16])
        for _ in range(600):
            m = tf.tanh(tf.matmul(m, m) * 0.05)
        return a + tf.reduce_mean(m) * 1e-3, b

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = (ds.map(heavy) if index == 1 else ds).batch(64)
    model.fit(ds, epochs=1, verbose=0)
    print(f"done {index}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["launch", "worker"])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--out", help="unused: the tests' runner passes it to every script")
    args = parser.parse_args()
    if args.mode == "worker":
        work(args.steps)
    else:
        launch(args.steps)
