"""The tasks PAPA is run on: GLUE and CoNLL-2003 tagging.

Label orders follow TFDS (and Hugging Face `datasets`), so local files and the
TFDS catalog give the same label ids.
"""

from __future__ import annotations

import dataclasses

NER_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC",
            "B-MISC", "I-MISC")
POS_TAGS = ('"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD",
            "DT", "EX", "FW", "IN", "JJ", "JJR", "JJS", "LS", "MD", "NN", "NNP",
            "NNPS", "NNS", "NN|SYM", "PDT", "POS", "PRP", "PRP$", "RB", "RBR",
            "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP",
            "VBZ", "WDT", "WP", "WP$", "WRB")
CHUNK_TAGS = ("O", "B-ADJP", "I-ADJP", "B-ADVP", "I-ADVP", "B-CONJP", "I-CONJP",
              "B-INTJ", "I-INTJ", "B-LST", "I-LST", "B-NP", "I-NP", "B-PP",
              "I-PP", "B-PRT", "I-PRT", "B-SBAR", "I-SBAR", "B-UCP", "I-UCP",
              "B-VP", "I-VP")


@dataclasses.dataclass(frozen=True)
class Task:
  """How to read, label and score one task.

  Attributes:
    name: the config name (`config.data.task`).
    kind: "classification", "regression" or "tagging".
    label_names: class names in label-id order (empty for regression).
    metrics: metric names; the first is the headline score.
    local_subdir: default folder under `$PAPA_SHARED/data`.
    files: split -> file name in the official distribution.
    text_columns: GLUE TSV header names of the one or two text fields (None
      for CoLA's header-less file, whose sentence is column 3).
    label_column: TSV header name of the label (CoLA: column 1).
    tag_column: CoNLL column of the tags (tagging).
    tfds_name: TFDS catalog name; tfds_text: its text feature names;
      tfds_splits: our split -> TFDS split.
  """

  name: str
  kind: str
  label_names: tuple[str, ...]
  metrics: tuple[str, ...]
  local_subdir: str
  files: dict[str, str]
  text_columns: tuple[str, ...] | None = None
  label_column: str | None = None
  tag_column: int = 0
  tfds_name: str = ""
  tfds_text: tuple[str, ...] = ()
  tfds_splits: dict[str, str] = dataclasses.field(default_factory=dict)
  eval_split: str = "validation"

  @property
  def num_labels(self) -> int:
    return 1 if self.kind == "regression" else len(self.label_names)

  @property
  def is_pair(self) -> bool:
    return len(self.tfds_text) == 2

  @property
  def headline_metric(self) -> str:
    return self.metrics[0]


def _glue(name, labels, metrics, subdir, text, label, tfds_text, dev="dev.tsv",
          kind="classification", eval_tfds="validation"):
  return Task(
      name=name, kind=kind, label_names=labels, metrics=metrics,
      local_subdir=subdir, files={"train": "train.tsv", "validation": dev},
      text_columns=text, label_column=label, tfds_name=f"glue/{name}",
      tfds_text=tfds_text,
      tfds_splits={"train": "train", "validation": eval_tfds})


def _conll(name, labels, metrics, column):
  return Task(
      name=name, kind="tagging", label_names=labels, metrics=metrics,
      local_subdir="conll2003",
      files={"train": "train.txt", "validation": "valid.txt", "test": "test.txt"},
      tag_column=column, tfds_name="conll2003",
      tfds_text=("tokens",),
      tfds_splits={"train": "train", "validation": "dev", "test": "test"})


TASKS: dict[str, Task] = {t.name: t for t in (
    _glue("cola", ("unacceptable", "acceptable"), ("matthews_correlation", "accuracy"),
          "cola", None, None, ("sentence",)),
    _glue("sst2", ("negative", "positive"), ("accuracy",), "sst2",
          ("sentence",), "label", ("sentence",)),
    _glue("mrpc", ("not_equivalent", "equivalent"), ("f1", "accuracy"), "mrpc",
          ("#1 String", "#2 String"), "Quality", ("sentence1", "sentence2")),
    _glue("qqp", ("not_duplicate", "duplicate"), ("f1", "accuracy"), "qqp",
          ("question1", "question2"), "is_duplicate", ("question1", "question2")),
    _glue("stsb", (), ("pearson", "spearman"), "stsb", ("sentence1", "sentence2"),
          "score", ("sentence1", "sentence2"), kind="regression"),
    _glue("mnli", ("entailment", "neutral", "contradiction"), ("accuracy",), "mnli",
          ("sentence1", "sentence2"), "gold_label", ("premise", "hypothesis"),
          dev="dev_matched.tsv", eval_tfds="validation_matched"),
    _glue("qnli", ("entailment", "not_entailment"), ("accuracy",), "qnli",
          ("question", "sentence"), "label", ("question", "sentence")),
    _glue("rte", ("entailment", "not_entailment"), ("accuracy",), "rte",
          ("sentence1", "sentence2"), "label", ("sentence1", "sentence2")),
    _glue("wnli", ("not_entailment", "entailment"), ("accuracy",), "wnli",
          ("sentence1", "sentence2"), "label", ("sentence1", "sentence2")),
    _conll("ner", NER_TAGS, ("f1", "precision", "recall", "accuracy"), 3),
    _conll("pos", POS_TAGS, ("accuracy",), 1),
    _conll("chunk", CHUNK_TAGS, ("f1", "precision", "recall", "accuracy"), 2),
)}


def get_task(name: str) -> Task:
  if name not in TASKS:
    raise ValueError(f"Unknown task {name!r}; known tasks: {sorted(TASKS)}.")
  return TASKS[name]
