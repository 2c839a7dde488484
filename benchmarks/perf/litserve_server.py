"""Not a benchmark: the serving bundle behind LitServe's dynamic batching, the server ``serve_load.py --server
litserve`` starts to measure ``aiayn serve`` against.

    python benchmarks/perf/litserve_server.py --bundle artifacts/export --port 8000 [--max-batch-requests 8] \\
        [--batch-timeout-ms 5] [--threads 1] [--log-path FILE]

Same model, same decoding options and the same ``POST /translate`` body and answer
(``{"sentences": [...]}`` -> ``{"translations": [...]}``) as ``aiayn serve``, so
``benchmarks/perf/serve_load.py --server litserve`` drives both with one client. LitServe batches
*requests* (``max_batch_size``), ``aiayn serve`` batches *sentences*; with 1-8 sentences per
request, 8 requests hold ~36 sentences on average, near ``aiayn serve``'s 32.

``--log-path FILE``: every request of a batch is committed to ``aiayn.serving.request_log.SqliteRequestLog`` (the same
SQLite WAL log, one ``synchronous=FULL`` transaction per request) in ``predict``, before LitServe
sends any answer of the batch: the durability ``aiayn serve`` gives (token counts are word counts
here, not sentencepiece pieces). Without it: no request log; either way no validation and no metrics.
Needs ``pip install litserve==0.2.17`` (the project's ``bench`` extra); ``--help`` works without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import litserve as ls
except ModuleNotFoundError:  # --help works without the bench extra; serving needs it (main says so)
    ls = None


class TranslateAPI(ls.LitAPI if ls is not None else object):
    """The bundle as a ``litserve.LitAPI`` (``kw``: LitAPI's own, e.g. ``max_batch_size``). A module-level class:
    LitServe hands it to its inference worker processes."""

    def __init__(self, bundle: Path, threads: int, log_path: Path | None = None, **kw) -> None:
        super().__init__(**kw)
        self.bundle, self.threads, self.log_path = bundle, threads, log_path

    def setup(self, device: str) -> None:
        from aiayn.inference.load import BundlePredictor

        bundle = BundlePredictor(self.bundle, threads=self.threads)
        self.translator, info, self.options = bundle.translator, bundle.info, bundle.options
        self.model = {"name": "litserve", "version": "0", "variant": info.get("variant")}
        self.log = None
        if self.log_path is not None:
            from aiayn.serving.request_log import SqliteRequestLog as RequestLog

            self.log = RequestLog(self.log_path)

    def decode_request(self, request: dict) -> list[str]:
        return request["sentences"]

    def batch(self, inputs: list[list[str]]) -> list[list[str]]:
        return inputs

    def predict(self, batch: list[list[str]]) -> list[list[str]]:
        flat = [s for request in batch for s in request]
        out = self.translator.translate(flat, self.options)
        answers, i = [], 0
        for request in batch:
            answers.append(out[i: i + len(request)])
            i += len(request)
        if self.log is not None:  # durable before any answer of the batch leaves, as in aiayn serve
            import time
            import uuid

            for request, answer in zip(batch, answers):
                self.log.write(uuid.uuid4().hex, ts=time.time(), model=self.model, beam_size=self.options.beam_size,
                               sources=request, source_tokens=[len(s.split()) for s in request],
                               output_tokens=[len(o.split()) for o in answer], outputs=answer)
        return answers

    def unbatch(self, output: list[list[str]]) -> list[list[str]]:
        return output

    def encode_response(self, output: list[str]) -> dict:
        return {"translations": output}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch-requests", type=int, default=8)
    ap.add_argument("--batch-timeout-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-path", type=Path, default=None, help="commit every request to this SQLite request log")
    args = ap.parse_args(argv)
    if ls is None:
        print("litserve is not installed: pip install litserve==0.2.17 (the project's bench extra)", file=sys.stderr)
        return 2
    api = TranslateAPI(args.bundle.resolve(), args.threads, args.log_path, max_batch_size=args.max_batch_requests,
                       batch_timeout=args.batch_timeout_ms / 1000, api_path="/translate")
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=120,
                          healthcheck_path="/ready")
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
