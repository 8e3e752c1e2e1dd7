r"""PAPA and effective-attention experiments: one command on CPU, GPU or TPU pod.

  python launch/main.py --config=configs/bert_sst2.py --workdir=DIR \
      [--config.stage=STAGE] [--config.field=value ...]

STAGE (default all) is a stage, run after the stages it needs (each skips
the work it finished before): means, optimal (when papa.variants has it), sort,
orderings, probe (all: these five), effective, finetune, linguistic, ablation,
knockout, patching, mixing (papa_jax/registry.py); or a
command: suite (a grid of runs and its report), report, explore. Every field,
its default and what it changes: docs/config.md.
Exits with status 75 when preempted (SIGTERM) after saving a checkpoint:
rerun the same command to resume.
"""

import os
import sys

# Config files import `configs.base`, which lives beside this launcher's folder
# (configs are not part of the installed package).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from papa_jax import cpu_tuning
from papa_jax.config import schema as config_schema  # noqa: E402  (imports JAX; creates no backend)

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
  # pylint: disable-next=import-outside-toplevel
  from papa_jax import commands, errors, parallel, preemption
  config = _CONFIG.value
  preemption.install()
  parallel.maybe_initialize_distributed(config)
  logging.info("JAX %s on %s: process %d/%d, %d devices.", jax.__version__, jax.default_backend(),
               jax.process_index(), jax.process_count(), jax.device_count())
  cpu = cpu_tuning.cpu_info()
  logging.info("CPU %s (%s); XLA_FLAGS=%r%s.", cpu_tuning.name(cpu), cpu["kind"],
               os.environ.get("XLA_FLAGS", ""),
               f", measured for this CPU kind: {_CPU_FLAGS}" if _CPU_FLAGS else "")
  changed = config_schema.changed_fields(config)
  logging.info("Config: %s (every other field at its default: docs/config.md).",
               ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "the defaults")
  try:
    commands.main(config, _WORKDIR.value)
  except preemption.Preempted as e:
    logging.warning("%s Rerun the same command to resume.", e)
    sys.exit(preemption.EXIT_CODE)
  except errors.PapaError as e:  # What the user can fix: one line, not a traceback.
    if os.environ.get("PAPA_TRACEBACK"):
      raise
    logging.error("%s: %s\n(PAPA_TRACEBACK=1 shows where it was raised.)", type(e).__name__, e)
    sys.exit(1)


_CPU_FLAGS: list[str] = []
HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")

if __name__ == "__main__":
  _CPU_FLAGS = cpu_tuning.apply()  # Before JAX creates its CPU backend.
  try:  # --config.papa.orderings=a,b; a moved field's flag names its new name.
    sys.argv[1:] = config_schema.launcher_argv(sys.argv[1:])
  except config_schema.ConfigError as e:
    sys.exit(str(e))
  import jax  # noqa: E402  pylint: disable=g-import-not-at-top
  jax.config.config_with_absl()
  logging.set_verbosity(logging.INFO)
  try:
    app.run(main)
  except SystemExit as e:  # absl ends --help (and --helpfull) with status 1: asked for, it is 0.
    if e.code == 1 and any(a in HELP_FLAGS for a in sys.argv[1:]):
      sys.exit(0)
    raise
