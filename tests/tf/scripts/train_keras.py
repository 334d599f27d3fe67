"""An ordinary Keras 3 / TensorFlow training script, written for no tool.

    python train_keras.py MODE [--steps N] [--epochs E] [--out DIR]

Modes:

* ``serial-map``: a tf.data pipeline whose per-sample ``map`` does CPU work in
  Python-free TensorFlow ops with no ``num_parallel_calls`` and no ``prefetch``:
  the model waits for its data.
* ``generator``: ``from_generator`` over slow Python (``time.sleep`` per sample).
* ``uncached``: the per-sample ``map`` in parallel, prefetched, with no ``cache``,
  over several epochs: the same work is redone every epoch.
* ``healthy``: in-memory tensors, cached, batched, prefetched: compute-bound.
* ``custom``: a custom loop, ``tf.GradientTape`` and ``optimizer.apply_gradients``
  run eagerly, over a pipeline whose batches arrive slowly; a
  ``tf.train.CheckpointManager`` saves every 20 steps (and is restored from at start).
* ``function-step``: a custom loop whose step is a ``tf.function`` (tape, gradient and
  ``apply_gradients`` traced into it), called on each batch of a pipeline iterated
  eagerly, whose batches arrive slowly.
* ``function-iter``: the same step, taking its batch itself (``next(iterator)``
  inside the ``tf.function``), as distributed custom loops do.
* ``validate``: ``fit`` with ``validation_data`` and ``ModelCheckpoint`` each epoch.
* ``mirrored``: ``MirroredStrategy`` over two logical CPU devices, a parallel
  prefetched pipeline.
* ``hang-callback``: ``fit`` with ``BackupAndRestore``; a callback stops for good
  in epoch 2 of the first attempt (a file in ``--out`` marks it), and the job
  resumes there on the next.

Prints ``step N loss L`` now and then and ``done`` at the end.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

FEATURES = 32


def arrays(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, FEATURES)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return x, y


def model():
    m = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(2),
    ])
    m.compile(keras.optimizers.Adam(1e-3),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


MAP_ROUNDS = 60
"""Matrix products per sample in :func:`heavy` (``--map-rounds``)."""


def set_map_rounds(rounds):
    global MAP_ROUNDS
    MAP_ROUNDS = rounds


def heavy(x, y):
    # Per-sample CPU work in TensorFlow ops: a few hundred small matrix products.
    m = tf.reshape(tf.tile(x, [8]), [16, 16])
    for _ in range(MAP_ROUNDS):
        m = tf.tanh(tf.matmul(m, m) * 0.05)
    return x + tf.reduce_mean(m) * 1e-3, y


class Every(keras.callbacks.Callback):
    def __init__(self, every):
        super().__init__()
        self.every = every
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen % self.every == 0:
            print(f"step {self.seen} loss {float(logs['loss']):.3f}", flush=True)


class StopForGood(keras.callbacks.Callback):
    def __init__(self, marker):
        super().__init__()
        self.marker = marker

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1 and not self.marker.exists():
            self.marker.write_text("stopped once\n")
            print("stuck", flush=True)
            time.sleep(3600)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--map-rounds", type=int, default=MAP_ROUNDS)
    args = parser.parse_args()
    set_map_rounds(args.map_rounds)
    tf.random.set_seed(0)
    n = args.steps * args.batch
    x, y = arrays(n)
    if args.mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            m = model()
    else:
        m = model()
    if args.mode == "mirrored":
        ds = (tf.data.Dataset.from_tensor_slices((x, y)).map(heavy, num_parallel_calls=2)
              .batch(args.batch).prefetch(tf.data.AUTOTUNE))
        m.fit(ds, epochs=args.epochs, verbose=0, callbacks=[Every(20)])
    elif args.mode == "serial-map":
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(heavy).batch(args.batch)
        m.fit(ds, epochs=args.epochs, verbose=0, callbacks=[Every(10)])
    elif args.mode == "generator":
        def gen():
            for i in range(n):
                time.sleep(0.0015)
                yield x[i], y[i]

        ds = tf.data.Dataset.from_generator(gen, output_signature=(
            tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.int32),
        )).batch(args.batch)
        m.fit(ds, epochs=args.epochs, verbose=0, callbacks=[Every(10)])
    elif args.mode == "uncached":
        ds = (tf.data.Dataset.from_tensor_slices((x, y))
              .map(heavy, num_parallel_calls=tf.data.AUTOTUNE)
              .batch(args.batch).prefetch(tf.data.AUTOTUNE))
        m.fit(ds, epochs=args.epochs, verbose=0, callbacks=[Every(20)])
    elif args.mode == "healthy":
        ds = (tf.data.Dataset.from_tensor_slices((x, y)).cache().batch(args.batch)
              .prefetch(tf.data.AUTOTUNE))
        m.fit(ds, epochs=args.epochs, verbose=0, callbacks=[Every(50)])
    elif args.mode == "custom":
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(heavy).batch(args.batch)
        opt = keras.optimizers.Adam(1e-3)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        ckpt = tf.train.Checkpoint(model=m, optimizer=opt)
        manager = tf.train.CheckpointManager(ckpt, str(args.out / "ckpt"), max_to_keep=2)
        ckpt.restore(manager.latest_checkpoint)
        step = 0
        for _ in range(args.epochs):
            for xb, yb in ds:
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, m(xb, training=True))
                grads = tape.gradient(loss, m.trainable_variables)
                opt.apply_gradients(zip(grads, m.trainable_variables, strict=True))
                step += 1
                if step % 10 == 0:
                    print(f"step {step} loss {float(loss):.3f}", flush=True)
                if step % 20 == 0:
                    manager.save()
    elif args.mode in ("function-step", "function-iter"):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(heavy).batch(args.batch)
        opt = keras.optimizers.Adam(1e-3)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def train(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, m(xb, training=True))
            grads = tape.gradient(loss, m.trainable_variables)
            opt.apply_gradients(zip(grads, m.trainable_variables, strict=True))
            return loss

        @tf.function
        def train_step(xb, yb):
            return train(xb, yb)

        @tf.function
        def train_next(iterator):
            return train(*next(iterator))

        @tf.function
        def predict(xb):
            return tf.reduce_mean(m(xb, training=False))

        step = 0
        for _ in range(args.epochs):
            if args.mode == "function-step":
                losses = (train_step(xb, yb) for xb, yb in ds)
            else:
                iterator = iter(ds)
                losses = (train_next(iterator) for _ in range(args.steps))
            for loss in losses:
                step += 1
                if step % 10 == 0:
                    print(f"step {step} loss {float(loss):.3f}", flush=True)
            if args.mode == "function-step":
                for xb, _ in ds.take(5):
                    predict(xb)
    elif args.mode == "validate":
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).prefetch(2)
        val = tf.data.Dataset.from_tensor_slices(arrays(n // 2)).batch(args.batch)
        ckpt = keras.callbacks.ModelCheckpoint(str(args.out / "model.keras"))
        m.fit(ds, epochs=args.epochs, validation_data=val, verbose=0,
              callbacks=[Every(20), ckpt])
    elif args.mode == "hang-callback":
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).prefetch(2)
        backup = keras.callbacks.BackupAndRestore(str(args.out / "backup"))
        m.fit(ds, epochs=args.epochs, verbose=0,
              callbacks=[backup, StopForGood(args.out / "stopped"), Every(20)])
    else:
        sys.exit(f"unknown mode {args.mode}")
    print("done", flush=True)


if __name__ == "__main__":
    main()
