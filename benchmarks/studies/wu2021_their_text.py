"""Wu et al. 2021's recipe on their text: lowercased, Moses-normalised, Moses-tokenized Multi30k.

Our Wu et al. run (``configs/multi30k_wu2021.yaml``) trains on the raw cased text and lowercases and
tokenizes its output for their metric; they trained on the multi30k/dataset repository's
``*.lc.norm.tok.*`` text (``aiayn.evaluation.moses_bleu`` says how it is made). This isolates that one difference
(docs/studies/wu2021.md). Two steps around one ``make run``, after ``aiayn fetch``:

    python benchmarks/studies/wu2021_their_text.py write --raw data/multi30k --out data/multi30k_lctok \\
        [--theirs REVISIT_MMT/data/multi30k-en-de]
    make run PARAMS=configs/multi30k_wu2021_lctok.yaml
    python benchmarks/studies/wu2021_their_text.py score --root . --text data/multi30k_lctok

``write`` writes that corpus (and with ``--theirs`` counts the lines that differ from the text LividWo/Revisit-MMT
ships); ``score`` is their BLEU on a finished run's hypotheses. Both print a Markdown table; what each does:
``tests/support/wu2021_text.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.tests_support.wu2021_text import score, write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write the lc.norm.tok corpus")
    w.add_argument("--raw", type=Path, default=Path("data/multi30k"))
    w.add_argument("--out", type=Path, default=Path("data/multi30k_lctok"))
    w.add_argument("--langs", default="en,de")
    w.add_argument("--theirs", type=Path, default=None)
    s = sub.add_parser("score", help="their BLEU of a finished run's hypotheses")
    s.add_argument("--root", type=Path, default=Path("."))
    s.add_argument("--text", type=Path, default=Path("data/multi30k_lctok"))
    args = ap.parse_args()
    if args.command == "write":
        src, tgt = args.langs.split(",")
        write(args.raw, args.out, (src, tgt), args.theirs)
    else:
        score(args.root, args.text)


if __name__ == "__main__":
    main()
