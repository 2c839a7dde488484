"""Corpus sources end to end, through real ``dvc repro`` / ``dvc exp run`` in scratch projects (slow tier).

- a corpus the test writes, in each local format (Moses, TSV, JSONL), trains through ``dvc repro``
  with no hand step, and the hygiene report counts a duplicate, an empty line, a test-contaminated
  pair and a wrong-language line;
- Multi30k En->Fr through ``dvc exp run -S data.tgt_lang=fr`` registers ``aiayn-en-fr`` and leaves
  ``aiayn-en-de``'s champion where it was; En->Cs runs on the splits Czech has.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SMOKE = REPO / "configs" / "smoke.yaml"

pytestmark = pytest.mark.slow


def sh(*cmd: str, cwd: Path, env: dict, timeout: int = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-6000:]}")
    return proc


def _env(prefect_harness: str, mirror: Path, tracking: bool) -> dict:
    env = os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "AIAYN_DATA_MIRROR": str(mirror),
                        "PREFECT_API_URL": prefect_harness, "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "1",
                        "OMP_NUM_THREADS": "1", "AIAYN_TRACKING": "1" if tracking else "0"}
    for name in ("MLFLOW_TRACKING_URI", "AIAYN_PARENT_RUN_ID", "AIAYN_REGISTERED_MODEL"):
        env.pop(name, None)
    return env


def _mirror_lines(mirror: Path, name: str, n: int) -> list[str]:
    return gzip.decompress((mirror / name).read_bytes()).decode("utf-8").split("\n")[:n]


def _tiny_config(path: Path, corpus: dict) -> Path:
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["data"] = {"corpus": corpus, "src_lang": "en", "tgt_lang": "de", "train_split": "train", "valid_split": "val",
                   "test_splits": ["test"], "langid": True, "min_words": 1, "max_ratio": 9.0}
    cfg["tokenize"] = {"model_type": "bpe", "vocab_size": 400}
    cfg["train"] |= {"max_steps": 10, "validate_every": 5, "checkpoint_every": 5, "keep_checkpoints": 2,
                     "average_last": 2, "log_every": 5}
    cfg["quantize"] = {"variants": ["ct2-float32"], "serving_preference": ["ct2-float32"], "gate_split": "test",
                       "score_check_sentences": 4, "calibration_sentences": 8, "layer_attribution": False,
                       "throughput": False}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.heavy
def test_each_local_format_trains_through_dvc_repro(tmp_path, prefect_harness, multi30k_mirror):
    from support.scratch import scratch_project

    en, de = (_mirror_lines(multi30k_mirror, f"train.{x}.gz", 400) for x in ("en", "de"))
    splits = {"train": list(zip(en[:300], de[:300])), "val": list(zip(en[300:340], de[300:340])),
              "test": list(zip(en[340:380], de[340:380]))}
    splits["train"] += [(" ", "leer"), splits["train"][7], splits["test"][3],  # empty, duplicate, contaminated
                        ("A man is riding a bicycle down the street.", "A man is riding a bicycle down the street.")]
    corpus_dir = "corpora/mine"
    root = scratch_project(tmp_path / "project", _tiny_config(tmp_path / "p.yaml", {"kind": "moses", "path": corpus_dir}))
    env = _env(prefect_harness, multi30k_mirror, tracking=False)
    writers = {
        "moses": lambda d, s, p: [(d / f"{s}.{lang}").write_text("".join(x[i] + "\n" for x in p), encoding="utf-8")
                                  for i, lang in enumerate(("en", "de"))],
        "tsv": lambda d, s, p: (d / f"{s}.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in p), encoding="utf-8"),
        "jsonl": lambda d, s, p: (d / f"{s}.jsonl").write_text(
            "".join(json.dumps({"translation": {"en": a, "de": b}}, ensure_ascii=False) + "\n" for a, b in p),
            encoding="utf-8"),
    }
    prepared = None
    for kind, write in writers.items():
        folder = root / "corpora" / kind
        folder.mkdir(parents=True)
        for split, pairs in splits.items():
            write(folder, split, pairs)
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["data"]["corpus"] |= {"kind": kind, "path": f"corpora/{kind}"}
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        out = sh(str(BIN / "dvc"), "repro", cwd=root, env=env).stdout
        assert "Running stage 'corpus'" in out and "Running stage 'prepare'" in out, out[-2000:]
        lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
        assert {"corpus", "prepare", "tokenize", "train", "evaluate", "quantize", "export"} <= set(lock)
        assert lock["corpus"]["deps"][0]["path"] == f"corpora/{kind}"
        report = json.loads((root / "artifacts" / "prepare_report.json").read_text())
        assert report["corpus"]["kind"] == kind
        dropped = report["splits"]["train"]["dropped"]
        assert dropped["empty"] == 1 and dropped["duplicate"] == 1 and dropped["contaminated"] == 1, dropped
        assert dropped["langid_tgt"] >= 1, dropped
        metrics = json.loads((root / "artifacts" / "eval_metrics.json").read_text())
        assert set(metrics) == {"test"} and 0 <= metrics["test"]["bleu"] <= 100
        text = {p.name: p.read_bytes() for p in (root / "artifacts" / "prepared").iterdir()}
        if prepared is None:
            prepared = text
            assert "Running stage 'train'" in out
            # the model card names the corpus this model was made from, not data.dvc's Multi30k
            card = json.loads((root / "artifacts" / "export" / "model_card.json").read_text())
            hashes = card["provenance"]["data_hashes"]
            assert hashes[f"corpora/{kind}"] == lock["corpus"]["deps"][0]["md5"] and "data/multi30k" not in hashes
        else:  # the same pairs in another format: the same prepared text, so DVC trains nothing again
            assert text == prepared and "Running stage 'train'" not in out
    shown = json.loads(sh(str(BIN / "dvc"), "metrics", "show", "--json", cwd=root, env=env).stdout)
    assert "artifacts/prepare_report.json" in shown[""]["data"]


@pytest.fixture
def multi30k_project(tmp_path, prefect_harness, multi30k_mirror):
    """A git + DVC scratch project on the smoke config with Multi30k fetched (tracking on, its own store)."""
    from support.scratch import scratch_project

    root = scratch_project(tmp_path / "project", SMOKE, git=True)
    env = _env(prefect_harness, multi30k_mirror, tracking=True)
    sh(str(BIN / "aiayn"), "fetch", "--mirror", str(multi30k_mirror), cwd=root, env=env)
    (root / ".gitignore").write_text("/data\n/mlflow.db\n/mlruns/\n")  # data.dvc versions data/, not git
    sh("git", "add", "-A", cwd=root, env=env)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "baseline", cwd=root, env=env)
    return root, env


@pytest.mark.heavy
def test_en_fr_registers_its_own_model_and_leaves_the_en_de_champion(multi30k_project):
    from mlflow.tracking import MlflowClient

    root, env = multi30k_project
    sh(str(BIN / "dvc"), "repro", cwd=root, env=env)
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    de_champion = client.get_model_version_by_alias("aiayn-en-de", "champion")
    sh(str(BIN / "dvc"), "exp", "run", "-S", "data.tgt_lang=fr", cwd=root, env=env)
    fr_champion = client.get_model_version_by_alias("aiayn-en-fr", "champion")
    assert str(fr_champion.version) == "1"
    again = client.get_model_version_by_alias("aiayn-en-de", "champion")
    assert (again.version, again.run_id) == (de_champion.version, de_champion.run_id)
    assert len(client.search_model_versions("name='aiayn-en-de'")) == 1
    scores = json.loads((root / "artifacts" / "eval" / "scores.json").read_text())
    assert scores["tgt_lang"] == "fr" and (root / "artifacts" / "eval" / "test_2016_flickr.hyp.fr").is_file()
    card = json.loads((root / "artifacts" / "export" / "model_card.json").read_text())
    assert card["name"] == "aiayn-en-fr" and card["corpus"]["pair"] == "en-fr" and card["corpus"]["kind"] == "multi30k"


@pytest.mark.heavy
def test_en_cs_runs_on_the_splits_czech_has(multi30k_project):
    root, env = multi30k_project
    env = env | {"AIAYN_TRACKING": "0"}
    failed = sh(str(BIN / "dvc"), "exp", "run", "-S", "data.tgt_lang=cs", cwd=root, env=env, check=False)
    assert failed.returncode != 0
    assert "multi30k has no split test_2017_flickr, test_2017_mscoco for en-cs" in failed.stdout + failed.stderr
    sh(str(BIN / "dvc"), "exp", "run", "-S", "data.tgt_lang=cs", "-S", "data.test_splits=[test_2016_flickr]", cwd=root,
       env=env)
    metrics = json.loads((root / "artifacts" / "eval_metrics.json").read_text())
    assert set(metrics) == {"test_2016_flickr"} and metrics["test_2016_flickr"]["chrf"] > 0
    assert json.loads((root / "artifacts" / "export" / "model_card.json").read_text())["name"] == "aiayn-en-cs"
