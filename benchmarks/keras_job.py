"""A plain Keras 3 training job that times itself, for benchmarks/keras_overhead.py.

    python keras_job.py {small,pipeline} --steps N

``small``: a 3-layer MLP on cached, prefetched in-memory data (a step of ~1-2 ms on
a CPU: the probe's per-step work weighs most here). ``pipeline``: the same model
fed by a tf.data map that does real work per sample, in parallel. The job prints
``steps_per_s X``: its own train steps a second from step 50 to the end, timed
by a callback of its own on the monotonic clock.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf


class Clock(keras.callbacks.Callback):
    def __init__(self, skip):
        super().__init__()
        self.skip = skip
        self.n = 0
        self.t0 = None
        self.t1 = None

    def on_train_batch_end(self, batch, logs=None):
        self.n += 1
        if self.n == self.skip:
            self.t0 = time.monotonic()
        self.t1 = time.monotonic()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=("small", "pipeline"))
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * 32, 32)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if args.model == "small":
        ds = ds.cache().batch(32).prefetch(tf.data.AUTOTUNE)
    else:
        def work(a, b):
            m = tf.reshape(tf.tile(a, [8]), [16, 16])
            for _ in range(20):
                m = tf.tanh(tf.matmul(m, m) * 0.05)
            return a + tf.reduce_mean(m) * 1e-3, b

        ds = ds.map(work, num_parallel_calls=tf.data.AUTOTUNE).batch(32).prefetch(4)
    model = keras.Sequential([
        keras.Input((32,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(2),
    ])
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    clock = Clock(50)
    model.fit(ds, epochs=1, verbose=0, callbacks=[clock])
    print(f"steps_per_s {(clock.n - clock.skip) / (clock.t1 - clock.t0):.3f}", flush=True)


if __name__ == "__main__":
    main()
