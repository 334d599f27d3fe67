"""An ordinary Keras 2 (``tf_keras``) training script, written for no tool.

    python train_tf_keras.py MODE [--steps N] [--epochs E] [--out DIR]

Modes:

* ``fit``: ``fit`` over a tf.data pipeline whose per-sample ``map`` has no
  ``num_parallel_calls`` and no ``prefetch``, with ``validation_data`` and
  ``ModelCheckpoint`` each epoch.
* ``custom``: a custom loop, ``tf.GradientTape`` and a Keras 2 optimizer's
  ``apply_gradients`` run eagerly.
* ``legacy``: the same loop with a legacy optimizer (``optimizers.legacy.SGD``).

Prints ``done`` at the end.
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras as keras

FEATURES = 32


def arrays(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, FEATURES)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def heavy(x, y):
    m = tf.reshape(tf.tile(x, [8]), [16, 16])
    for _ in range(60):
        m = tf.tanh(tf.matmul(m, m) * 0.05)
    return x + tf.reduce_mean(m) * 1e-3, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["fit", "custom", "legacy"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    tf.random.set_seed(0)
    x, y = arrays(args.steps * 32)
    model = keras.Sequential([
        keras.layers.Dense(128, activation="relu", input_shape=(FEATURES,)),
        keras.layers.Dense(2),
    ])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(heavy).batch(32)
    if args.mode == "fit":
        model.compile(keras.optimizers.Adam(1e-3), loss_fn)
        val = tf.data.Dataset.from_tensor_slices(arrays(320)).batch(32)
        ckpt = keras.callbacks.ModelCheckpoint(str(args.out / "model.h5"))
        model.fit(ds, epochs=args.epochs, validation_data=val, verbose=0, callbacks=[ckpt])
    else:
        opt = (keras.optimizers.legacy.SGD(0.01) if args.mode == "legacy"
               else keras.optimizers.Adam(1e-3))
        for _ in range(args.epochs):
            for xb, yb in ds:
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    print("done", flush=True)


if __name__ == "__main__":
    main()
