"""Example model module: regression on scikit-learn's diabetes data, read from CSV files in the store.

Data (``make example-data`` writes it; ``examples/diabetes.yml`` points at it): CSV shards with a header
line ``age,sex,bmi,bp,s1,s2,s3,s4,s5,s6,target``; the ten features are standardised already (training
split's mean and standard deviation, applied when the shards were written), so the model needs no
Normalization layer; ``target`` (the label column) is a measure of disease progression one year after
baseline, in its own units (25 to 346, mean about 152).

No ``make_dataset``: the cluster file's ``data:`` section gives the data. The harness reads each CSV
row as a float32 feature vector [10] and a float32 label.

The model ends in a fixed rescaling (``y = 80 z + 150``: a rough prior of the target's scale) so that its
last Dense layer works on standardised values while the loss and the metrics are in the target's units:
Adam then needs a few hundred steps, not thousands. Expected on the test split (89 rows) after 400
steps of 32 at learning rate 0.002: MAE about 40-43, RMSE about 51-55 (a linear regression gets 42.8 and
53.9, always predicting the mean 64 and 73). Longer training overfits these 353 rows: more steps or
wider layers give a worse test error.
"""

from __future__ import annotations

import keras

INPUT_FEATURES = 10
TARGET_SCALE = 80.0   # about the target's standard deviation (78 on the training split)
TARGET_OFFSET = 150.0  # about its mean (154)
DEFAULT_UNITS = 16

loss = "mse"


def metrics():
    """Mean absolute error first (the headline), in the target's units; then the root mean squared error."""
    return [keras.metrics.MeanAbsoluteError(name="mae"), keras.metrics.RootMeanSquaredError(name="rmse")]


def build_model(hparams=None):
    """A two-layer MLP: [N, 10] standardised features -> [N, 1] predicted target.
    ``hparams`` (training.hparams): ``units`` per hidden layer, default 16."""
    units = int((hparams or {}).get("units", DEFAULT_UNITS))
    return keras.Sequential([
        keras.Input(shape=(INPUT_FEATURES,)),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(units, activation="relu"),
        keras.layers.Dense(1),
        keras.layers.Rescaling(TARGET_SCALE, offset=TARGET_OFFSET),
    ], name="diabetes_mlp")
