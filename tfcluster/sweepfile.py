"""The sweep file: what a sweep tries, how it ranks its trials, and how many run at once.

```yaml
name: lr-units                 # default: the file's name without .yml
method: grid                   # grid: every combination; random: `trials` draws from `seed`
parameters:                    # training.<field> (steps, batch_size, learning_rate, checkpoint_every)
  training.learning_rate: [0.001, 0.01]     # or hparams.<name> (the model's build_model(hparams))
  hparams.units: [16, 32]                   # random: also {min: a, max: b, log: true}
metric: mae                    # default: the model's headline (its first metric)
direction: minimize            # default known for common metric names (accuracy, auc, mae, loss ...)
parallel: 2                    # trials at once, each on its own group of nodes (tfcluster.groups)
```

:func:`load` checks all of it, and every trial's configuration, before anything is created; a bad value is
a :class:`ConfigError` naming ``sweep <file>: <field>``. A trial is known by its values (:func:`trial_key`),
so a sweep file that grows keeps what earlier runs of it found.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import groups, job
from .config import RunSpec, resolve
from .errors import MISSING, ConfigError, JobError

MAX_TRIALS = 500
#: the training fields a sweep may vary (hparams separately); the rest shape the cluster or the job
SWEEPABLE = ("steps", "batch_size", "learning_rate", "checkpoint_every")
#: metric names whose better direction is known; any other needs `direction:`
MAXIMIZE = {"accuracy", "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy", "auc",
            "precision", "recall", "f1_score", "r2_score", "top_k_categorical_accuracy"}
MINIMIZE = {"loss", "mae", "mse", "rmse", "mape", "msle", "mean_absolute_error", "mean_squared_error",
            "root_mean_squared_error", "mean_absolute_percentage_error", "logcosh", "huber"}
DIRECTIONS = ("maximize", "minimize")
KEYS = ("name", "method", "seed", "trials", "parameters", "metric", "direction", "parallel")


@dataclass
class Sweep:
    name: str
    path: Path
    method: str
    parameters: dict[str, list | dict]
    metric: str                  # test_<name>, as the verified metrics name it
    direction: str
    parallel: int
    seed: int = 0
    count: int = 0               # random: how many trials
    trials: list[dict] = field(default_factory=list)   # {"id", "key", "params"}

    @property
    def goal(self) -> str:
        """``maximizing auc``: what the ranking of the trials seeks."""
        return f"{'maximizing' if self.direction == 'maximize' else 'minimizing'} {self.metric.removeprefix('test_')}"


# -- the sweep file ----------------------------------------------------------------------------------------
def _fail(sweep_path: Path, key: str, value, allowed: str):
    return ConfigError(f"sweep {sweep_path}: {key}", value, allowed)


def _param_field(path: Path, key: str) -> str:
    """The configuration field a parameter sets: ``training.<field>`` or ``training.hparams`` (for
    ``hparams.<name>``)."""
    parts = key.split(".")
    if parts[0] == "training" and len(parts) == 2 and parts[1] in SWEEPABLE:
        return key
    if (parts[:1] == ["hparams"] and len(parts) == 2 or parts[:2] == ["training", "hparams"] and len(parts) == 3) \
            and parts[-1].isidentifier():
        return "training.hparams"
    raise _fail(path, "parameters", key, "training." + ", training.".join(SWEEPABLE)
                + ", or hparams.<name> (a value passed to the model's build_model(hparams))")


def _check_values(path: Path, method: str, key: str, values) -> None:
    where = f"parameters.{key}"
    scalar = (str, int, float, bool)
    if isinstance(values, list):
        if not values or not all(isinstance(v, scalar) for v in values):
            raise _fail(path, where, values, "a non-empty list of numbers, strings or booleans")
        return
    if method == "random" and isinstance(values, dict):
        low, high = values.get("min"), values.get("max")
        unknown = set(values) - {"min", "max", "log"}
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
        if unknown or not numbers or not low < high or (values.get("log") and low <= 0):
            raise _fail(path, where, values, "a list of values, or {min: a, max: b} with a < b (log: true "
                                             "samples on a log scale and needs a > 0)")
        return
    raise _fail(path, where, values, "a list of values" + (" or {min: a, max: b[, log: true]}"
                                                            if method == "random" else ""))


def _default_direction(metric: str) -> str | None:
    name = metric.removeprefix("test_")
    return "maximize" if name in MAXIMIZE else "minimize" if name in MINIMIZE else None


def sweep_name(path: str | Path) -> str:
    """The sweep's name: its ``name:``, else the file's stem (no other check)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        data = {}
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else Path(path).stem


def load(path: str | Path, spec: RunSpec) -> Sweep:
    """Read and check a sweep file against the cluster's configuration (every trial's configuration is
    validated too); raises ConfigError naming the field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("SWEEP", str(path), "an existing sweep file (YAML)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise _fail(path, "file", str(path), f"valid YAML ({exc})".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise _fail(path, "file", type(data).__name__, "a YAML mapping with keys " + ", ".join(KEYS))
    for key in data:
        if key not in KEYS:
            raise _fail(path, key, data[key], "one of the keys " + ", ".join(KEYS))
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum() or len(name) > 40:
        raise _fail(path, "name", name, "1-40 characters of letters, digits, '-' and '_'")
    method = data.get("method", "grid")
    if method not in ("grid", "random"):
        raise _fail(path, "method", method, "grid (every combination) or random")
    params = data.get("parameters")
    if not isinstance(params, dict) or not params:
        raise _fail(path, "parameters", params, "a mapping of fields (training.learning_rate, hparams.<name> "
                                                "...) to the values to try")
    for key, values in params.items():
        _param_field(path, str(key))
        _check_values(path, method, str(key), values)
    parallel = data.get("parallel", 1)
    if not isinstance(parallel, int) or isinstance(parallel, bool):
        raise _fail(path, "parallel", parallel, f"an integer from 1 to {groups.MAX_GROUPS}")
    groups.check_parallel(spec.cluster, parallel, f"sweep {path}: parallel")
    seed, count = data.get("seed", 0), data.get("trials", MISSING)
    if method == "random":
        for key, value in (("seed", seed), ("trials", count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "trials" else 0):
                raise _fail(path, key, value, "an integer ≥ " + ("1" if key == "trials" else "0"))
    elif "trials" in data or "seed" in data:
        raise _fail(path, "trials" if "trials" in data else "seed", data.get("trials", seed),
                    "only with method: random (a grid runs every combination)")
    else:
        count = 0      # a grid's trials are its combinations
    checked = job.check(spec)
    allowed = ["loss", *checked["metrics"]]
    metric = str(data.get("metric", allowed[1] if len(allowed) > 1 else "loss")).removeprefix("test_")
    if metric not in allowed:
        raise _fail(path, "metric", metric, f"a metric of {checked['module']}: {', '.join(allowed)}")
    known = _default_direction(metric)
    direction = data.get("direction", known)
    if direction not in DIRECTIONS:
        raise _fail(path, "direction", direction, "maximize or minimize"
                    + ("" if known else f" (no default for the metric {metric})"))
    if known and direction != known:   # the best trial would be the worst one
        raise _fail(path, "direction", direction, f"{known}, the direction of {metric} (or leave direction out)")
    sweep = Sweep(name=name, path=path, method=method, parameters={str(k): v for k, v in params.items()},
                  metric=f"test_{metric}", direction=direction, parallel=parallel, seed=seed, count=count)
    sweep.trials = expand(sweep)
    if len(sweep.trials) > MAX_TRIALS:
        raise _fail(path, "parameters", f"{len(sweep.trials)} trials", f"at most {MAX_TRIALS} trials")
    specs = [trial_spec(spec, sweep, t["params"]) for t in sweep.trials]   # every value valid for its field
    variants = list({json.dumps(s.training.hparams, sort_keys=True): s.training.hparams for s in specs}.values())
    if variants != [spec.training.hparams]:
        try:        # the model takes hparams, builds with each trial's and reads each name with one at least
            job.check(specs[0], hparams_variants=variants)
        except JobError as exc:
            raise JobError(f"sweep {path}: {exc}") from None
    return sweep


def expand(sweep: Sweep) -> list[dict]:
    """The trials, in a stable order: every combination (grid), or ``count`` draws from ``seed``."""
    keys = list(sweep.parameters)
    if sweep.method == "grid":
        combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*sweep.parameters.values())]
    else:
        rng = random.Random(sweep.seed)
        combos = [{k: _draw(rng, sweep.parameters[k]) for k in keys} for _ in range(sweep.count)]
    width = max(2, len(str(len(combos) - 1)))
    return [{"id": f"t{i:0{width}d}", "key": trial_key(sweep.name, p), "params": p} for i, p in enumerate(combos)]


def _draw(rng: random.Random, values):
    if isinstance(values, list):
        return rng.choice(values)
    low, high = values["min"], values["max"]
    if isinstance(low, int) and isinstance(high, int) and not values.get("log"):
        return rng.randint(low, high)
    x = math.exp(rng.uniform(math.log(low), math.log(high))) if values.get("log") else rng.uniform(low, high)
    x = float(f"{x:.4g}")
    return round(x) if isinstance(low, int) and isinstance(high, int) else x


def params_text(params: dict, sep: str = ", ") -> str:
    """A trial's values by their last name part: ``learning_rate=0.01, batch_size=64``."""
    return sep.join(f"{k.rsplit('.', 1)[1]}={v}" for k, v in params.items())


def trial_key(name: str, params: dict) -> str:
    """A trial's identity: the sweep's name and its values (its run carries it; only it resumes it)."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    return f"{name}/{digest}"


def trial_spec(spec: RunSpec, sweep: Sweep, params: dict) -> RunSpec:
    """The cluster's configuration with the trial's values."""
    overrides: dict = {}
    hparams = dict(spec.training.hparams)
    for key, value in params.items():
        if _param_field(sweep.path, key) == "training.hparams":
            hparams[key.rsplit(".", 1)[1]] = value
        else:
            overrides[key] = value
    if hparams != spec.training.hparams:
        overrides["training.hparams"] = hparams
    try:
        return resolve(spec.to_dict(), overrides)
    except ConfigError as exc:
        key = next((k for k in params if exc.field in (k, "training.hparams")), exc.field)
        raise _fail(sweep.path, f"parameters.{key}", params.get(key, exc.value), exc.allowed) from None
