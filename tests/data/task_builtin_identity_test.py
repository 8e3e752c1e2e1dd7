"""Built-in tasks read the shared files into exactly the records of the pre-"tasks as data" readers.

The digests were recorded from the readers of commit def1d40 (GLUE TSV and
CoNLL readers, and the TFDS builder over them, which gave the same records).
The old reader rejected MRPC's byte-order mark, so its MRPC digests were
recorded on copies of the files without the BOM.
"""

import hashlib
import json

import pytest

from papa_jax.data import readers, tasks
from tests.conftest import require_shared

pytestmark = pytest.mark.unit


def digest(records: list[dict]) -> str:
  text = json.dumps(records, sort_keys=True, ensure_ascii=False)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


OLD = [  # task, shared folder, split, records, digest
    ("sst2", "sst2", "train", 67349, "62684fc4a9c16ad7"),
    ("sst2", "sst2", "validation", 872, "a300ab1bd61aea25"),
    ("cola", "cola", "train", 8551, "250502928c2b7c67"),
    ("cola", "cola", "validation", 1043, "908dea871930dc07"),
    ("ner", "conll2003", "train", 14041, "7d42cf48e1e6f8cc"),
    ("ner", "conll2003", "validation", 3250, "561de4ee297c05d6"),
    ("ner", "conll2003", "test", 3453, "98ab6cc9fe6e1996"),
    ("pos", "conll2003", "train", 14041, "f0d2c1dc315739d4"),
    ("pos", "conll2003", "validation", 3250, "11207c7ef2afd67a"),
    ("pos", "conll2003", "test", 3453, "c39530203f3058e0"),
    ("chunk", "conll2003", "validation", 3250, "ed79512dc18d2053"),
    ("mrpc", "mrpc", "train", 3668, "268027d723962bd2"),
    ("mrpc", "mrpc", "validation", 408, "a819259012b49ccd"),
]


@pytest.mark.parametrize("name,folder,split,n,want", OLD)
def test_task_builtin_records_identical_to_old_readers(name, folder, split, n, want):
  d = require_shared("data", folder)
  recs = list(readers.read_split(tasks.get_task(name), str(d), split))
  assert len(recs) == n
  assert digest(recs) == want
