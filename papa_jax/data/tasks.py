"""What a task is (one dataclass), and the built-in tasks.

A task is data: its files' format and fields, its label set, its kind and its
metrics. Built-in tasks are entries of `TASKS`; a custom task is the same
dataclass built from `config.data.custom` (see `declare.py`). Built-in label
orders follow TFDS (and Hugging Face `datasets`), so local files and the TFDS
catalog give the same label ids.
"""

from __future__ import annotations

import dataclasses
import types

from papa_jax.data.errors import TaskConfigError

KINDS = ("classification", "regression", "tagging")
# The metrics of papa_jax/probing/metrics.py each kind can report. Tagging scores
# entities (IOB chunks: f1, precision, recall, plus token accuracy) when "f1" is
# among its metrics, else token accuracy alone.
METRICS = types.MappingProxyType({
    "classification": ("accuracy", "f1", "matthews_correlation"),
    "regression": ("pearson", "spearman"),
    "tagging": ("f1", "precision", "recall", "accuracy"),
})
ENTITY_METRICS = ("f1", "precision", "recall", "accuracy")
TOKEN_METRICS = ("accuracy",)

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
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART",
             "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")


@dataclasses.dataclass(frozen=True)
class Task:
  """How to read, label and score one task.

  Attributes:
    name: shown in results (`config.data.task`, or `data.custom.name`).
    kind: "classification", "regression" or "tagging".
    label_names: class names (or tags) in label-id order; empty for regression,
      and for a declared task whose labels are still to be collected.
    metrics: metric names; the first is the headline score.
    format: a registered format's name (`formats.FORMATS`: csv, tsv, jsonl, conll, conllu).
    files: split -> file (relative to the data directory, or absolute).
    local_subdir: default data directory under `$PAPA_SHARED/data` ("": none).
    file_patterns: `files` are glob patterns matching one file each.
    header: csv/tsv: the first row names the columns.
    quoting: csv/tsv: "rfc4180" or "none" ("": csv rfc4180, tsv none).
    text_fields: the one or two text fields (header names, JSON keys, or
      0-based column numbers written as strings in a header-less file).
    label_field: the label's header name, JSON key or column number.
    label_ids_in_file: labels may also be written as their ids (GLUE files).
    token_column, tag_column: CoNLL columns (negative: from the last).
    separator: CoNLL column separator, "whitespace" (spaces/tabs) or "tab".
    tag_field: CoNLL-U field of the tags, "upos" or "xpos".
    tfds_name: TFDS catalog name ("": none); tfds_text: its text features;
      tfds_tags: its tag feature; tfds_splits: our split -> TFDS split.
    eval_split: the split scores are reported on.
  """

  name: str
  kind: str
  label_names: tuple[str, ...]
  metrics: tuple[str, ...]
  format: str
  files: dict[str, str]
  local_subdir: str = ""
  file_patterns: bool = False
  header: bool = True
  quoting: str = ""
  text_fields: tuple[str, ...] = ()
  label_field: str = ""
  label_ids_in_file: bool = False
  token_column: int = 0
  tag_column: int = -1
  separator: str = "whitespace"
  tag_field: str = "upos"
  tfds_name: str = ""
  tfds_text: tuple[str, ...] = ()
  tfds_tags: str = ""
  tfds_splits: dict[str, str] = dataclasses.field(default_factory=dict)
  eval_split: str = "validation"

  @property
  def num_labels(self) -> int:
    return 1 if self.kind == "regression" else len(self.label_names)

  @property
  def is_pair(self) -> bool:
    return len(self.text_fields) == 2

  @property
  def headline_metric(self) -> str:
    return self.metrics[0]

  def default_max_length(self, papa_layout: bool = True) -> int:
    """The input length configs give this task (the one rule, here with the task).

    Tagging: 64 (tokens stay in place; CoNLL sentences are short). Pairs: 128
    (the PAPA layout gives each segment half). One sentence: 64 in the PAPA
    layout (its first half holds the sentence, as the paper's CoLA command),
    128 without (so sentences longer than a head dimension keep every token).
    """
    if self.kind == "tagging":
      return 64
    if self.is_pair:
      return 128
    return 64 if papa_layout else 128


def _glue(name, labels, metrics, text, label, tfds_text, dev="dev.tsv",
          kind="classification", eval_tfds="validation", header=True):
  return Task(
      name=name, kind=kind, label_names=labels, metrics=metrics, format="tsv",
      files={"train": "train.tsv", "validation": dev}, local_subdir=name, header=header,
      text_fields=text, label_field=label, label_ids_in_file=True,
      tfds_name=f"glue/{name}", tfds_text=tfds_text,
      tfds_splits={"train": "train", "validation": eval_tfds})


def _conll(name, labels, metrics, column, tfds_tags):
  return Task(
      name=name, kind="tagging", label_names=labels, metrics=metrics, format="conll",
      files={"train": "train.txt", "validation": "valid.txt", "test": "test.txt"},
      local_subdir="conll2003", token_column=0, tag_column=column,
      tfds_name="conll2003", tfds_text=("tokens",), tfds_tags=tfds_tags,
      tfds_splits={"train": "train", "validation": "dev", "test": "test"})


TASKS: dict[str, Task] = {t.name: t for t in (
    # CoLA's files have no header: source, label, original mark, sentence.
    _glue("cola", ("unacceptable", "acceptable"), ("matthews_correlation", "accuracy"),
          ("3",), "1", ("sentence",), header=False),
    _glue("sst2", ("negative", "positive"), ("accuracy",), ("sentence",), "label",
          ("sentence",)),
    _glue("mrpc", ("not_equivalent", "equivalent"), ("f1", "accuracy"),
          ("#1 String", "#2 String"), "Quality", ("sentence1", "sentence2")),
    _glue("qqp", ("not_duplicate", "duplicate"), ("f1", "accuracy"),
          ("question1", "question2"), "is_duplicate", ("question1", "question2")),
    _glue("stsb", (), ("pearson", "spearman"), ("sentence1", "sentence2"), "score",
          ("sentence1", "sentence2"), kind="regression"),
    _glue("mnli", ("entailment", "neutral", "contradiction"), ("accuracy",),
          ("sentence1", "sentence2"), "gold_label", ("premise", "hypothesis"),
          dev="dev_matched.tsv", eval_tfds="validation_matched"),
    _glue("qnli", ("entailment", "not_entailment"), ("accuracy",), ("question", "sentence"),
          "label", ("question", "sentence")),
    _glue("rte", ("entailment", "not_entailment"), ("accuracy",), ("sentence1", "sentence2"),
          "label", ("sentence1", "sentence2")),
    _glue("wnli", ("not_entailment", "entailment"), ("accuracy",), ("sentence1", "sentence2"),
          "label", ("sentence1", "sentence2")),
    _conll("ner", NER_TAGS, ENTITY_METRICS, 3, "ner"),
    _conll("pos", POS_TAGS, TOKEN_METRICS, 1, "pos"),
    _conll("chunk", CHUNK_TAGS, ENTITY_METRICS, 2, "chunks"),
    # Universal Dependencies: data.data_dir is one treebank's directory.
    Task(name="udpos", kind="tagging", label_names=UPOS_TAGS, metrics=TOKEN_METRICS,
         format="conllu", tag_field="upos", file_patterns=True,
         files={"train": "*-ud-train.conllu", "validation": "*-ud-dev.conllu",
                "test": "*-ud-test.conllu"}),
)}


def get_task(name: str) -> Task:
  """A built-in task by name (a custom task comes from `resolve_task(config.data)`)."""
  if name not in TASKS:
    hint = (" A custom task is declared in data.custom and read with "
            "papa_jax.data.resolve_task(config.data)." if name == "custom" else
            " Or set data.task='custom' and declare the task in data.custom.")
    raise TaskConfigError(f"Unknown task {name!r}; known tasks: {sorted(TASKS)}.{hint}")
  return TASKS[name]
