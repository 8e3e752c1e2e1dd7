"""PAPA and effective-attention experiments: one command on CPU, GPU or TPU pod.

  python launch/main.py --config=configs/bert_sst2.py --workdir=DIR \
      [--config.stage=means|sort|probe|all|effective] [--config.field=value ...]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for outputs and checkpoints.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # Orbax logs every checkpoint step at INFO; keep its warnings only.
  logging.get_absl_logger().addFilter(
      lambda r: r.levelno >= 30 or "orbax" not in r.pathname)  # 30: Python WARNING.
  import jax  # pylint: disable=import-outside-toplevel
  from papa_jax import parallel, run  # pylint: disable=import-outside-toplevel
  config = _CONFIG.value
  parallel.maybe_initialize_distributed(config)
  logging.info("JAX %s on %s: process %d/%d, %d devices.", jax.__version__, jax.default_backend(),
               jax.process_index(), jax.process_count(), jax.device_count())
  logging.info("Config:\n%s", config)
  run.run(config, _WORKDIR.value)


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  app.run(main)
