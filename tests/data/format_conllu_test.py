"""CoNLL-U, written by hand from the specification (universaldependencies.org/format.html)."""

import pytest

from papa_jax.data import conll
from tests.data.conftest import write

pytestmark = pytest.mark.unit

# Sentence 1: the spec's multiword token example (Spanish "vámonos al mar").
# Sentence 2: the spec's empty-node example ("Sue likes coffee and Bill tea").
# Sentence 3: a FORM with a space (as in Vietnamese treebanks), an empty node before
# the first word (0.1), and no blank line at the end of the file.
CONLLU = """\
# newdoc id = spec
# sent_id = 1
# text = Vámonos al mar.
1-2\tVámonos\t_\t_\t_\t_\t_\t_\t_\t_
1\tVamos\tir\tVERB\t_\tMood=Imp|Number=Plur|Person=1|VerbForm=Fin\t0\troot\t_\t_
2\tnos\tnosotros\tPRON\t_\tCase=Acc|Number=Plur|Person=1|PronType=Prs\t1\tobj\t_\t_
3-4\tal\t_\t_\t_\t_\t_\t_\t_\t_
3\ta\ta\tADP\t_\t_\t5\tcase\t_\t_
4\tel\tel\tDET\t_\tDefinite=Def|Gender=Masc|Number=Sing|PronType=Art\t5\tdet\t_\t_
5\tmar\tmar\tNOUN\t_\tNumber=Sing\t1\tobl\t_\tSpaceAfter=No
6\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_

# sent_id = 2
# text = Sue likes coffee and Bill tea
1\tSue\tSue\tPROPN\tNNP\t_\t2\tnsubj\t2:nsubj|5.1:nsubj\t_
2\tlikes\tlike\tVERB\tVBZ\t_\t0\troot\t0:root\t_
3\tcoffee\tcoffee\tNOUN\tNN\t_\t2\tobj\t2:obj\t_
4\tand\tand\tCCONJ\tCC\t_\t5\tcc\t5.1:cc\t_
5\tBill\tBill\tPROPN\tNNP\t_\t2\tconj\t2:conj:and|5.1:nsubj\t_
5.1\tlikes\tlike\tVERB\tVBZ\t_\t_\t_\t2:conj:and\tCopyOf=2
6\ttea\ttea\tNOUN\tNN\t_\t5\torphan\t5.1:obj\tSpaceAfter=No

# sent_id = 3
# text = Hà Nội !
0.1\tlà\tlà\tAUX\tV\t_\t_\t_\t1:cop\t_
1\tHà Nội\tHà Nội\tPROPN\tNp\t_\t0\troot\t0:root\t_
2\t!\t!\tPUNCT\tCH\t_\t1\tpunct\t1:punct\t_"""

WORDS = [["Vamos", "nos", "a", "el", "mar", "."],
         ["Sue", "likes", "coffee", "and", "Bill", "tea"],
         ["Hà Nội", "!"]]
UPOS = [["VERB", "PRON", "ADP", "DET", "NOUN", "PUNCT"],
        ["PROPN", "VERB", "NOUN", "CCONJ", "PROPN", "NOUN"],
        ["PROPN", "PUNCT"]]


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_format_conllu_spec_lines(tmp_path, line_end, bom):
  path = write(tmp_path, "x.conllu", bom + CONLLU.replace("\n", line_end).encode())
  sents = list(conll.read_conllu(str(path), tag_field="upos"))
  assert [list(s.tokens) for s in sents] == WORDS
  assert [list(s.tags) for s in sents] == UPOS
  assert sents[0].tag_lines == (5, 6, 8, 9, 10, 11) and sents[2].line == 26


def test_format_conllu_xpos_and_final_blank_lines(tmp_path):
  text = CONLLU.split("# sent_id = 2\n")[1] + "\n\n\n"  # Sentences 2 and 3, then blanks.
  path = write(tmp_path, "x.conllu", "# sent_id = 2\n" + text)
  sents = list(conll.read_conllu(str(path), tag_field="xpos"))
  assert [list(s.tags) for s in sents] == [["NNP", "VBZ", "NN", "CC", "NNP", "NN"], ["Np", "CH"]]
