"""Load on ``aiayn serve`` (loopback) next to calling the bundle's model directly, in one run.

    python benchmarks/perf/serve_load.py --bundle artifacts/export [--clients 1 8 32 100] [--rounds 3]

For each client count: ``clients`` concurrent asyncio clients each send their share of a fixed
number of requests (1-8 sentences each, drawn with a fixed seed from the source file) and stop.
Reported: sentences/s and p50/p95/p99 request latency (ms). Side by side, same sentences, same
process start: the model called directly (``BundlePredictor`` + ``translate``) in batches of
``--max-batch-sentences`` (throughput) and one sentence at a time (latency). Rounds alternate
service / direct; medians with min-max. The service runs in its own process (``aiayn serve``) so
the clients do not share its interpreter; both sides use the same threads setting.

``--server litserve`` puts the same bundle behind LitServe's dynamic batching instead
(``benchmarks/perf/litserve_server.py``; ``--max-batch-sentences 32`` becomes 8 requests of 1-8 sentences),
so one run of each gives the library-vs-our-batcher comparison, each against its own direct baseline.
Like for like by default: the LitServe app commits every request to the same SQLite request log
before answering (``--no-log``: without it, batching and transport only).

Targets: at 32 clients the service reaches >= 0.8x the direct batch throughput; at one client its p95
latency is <= the direct single-sentence p95 + 20 ms. Results: docs/results.md, "Serving load".

``--before REV`` measures two services side by side instead of the service against the model: the code
of git revision REV (exported with ``git archive`` into a temporary folder and run from there with this
venv, ``python -m aiayn`` with ``PYTHONPATH`` on the exported tree) and this checkout, same bundle, same
settings, rounds alternating before/after; the table gives sentences/s and p95 of each and their ratio, e.g.

    python benchmarks/perf/serve_load.py --bundle artifacts/export --clients 1 32 100 --rounds 5 --before 5039383

``--serve-args=--no-scores`` adds flags to this checkout's service only (e.g. the cost of a score in every
answer, measured against a service before it had one). ``--before .`` is this checkout on both sides, so
``--before-args`` (flags of the before side only) measures one feature's cost in the same code, e.g. the output
signals against plain decoding:

    python benchmarks/perf/serve_load.py --clients 1 32 --rounds 5 --before . --before-args=--no-output-signals
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.harness import REPO, Spread, host_line, markdown_table, ratios, round_order
from benchmarks.local_service import free_port, start_service, stop_service

BIN = Path(sys.executable).parent


def requests_for(lines: list[str], n: int, seed: int, most: int = 8) -> list[list[str]]:
    """``n`` requests of 1..``most`` sentences drawn from ``lines`` (fixed seed)."""
    rng = random.Random(seed)
    return [[rng.choice(lines) for _ in range(rng.randint(1, most))] for _ in range(n)]


async def run_clients(url: str, reqs: list[list[str]], clients: int) -> tuple[float, list[float]]:
    """(sentences/s, latencies in ms): ``clients`` workers share ``reqs`` and stop when it is empty."""
    queue = list(reversed(reqs))
    lat: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:

        async def worker() -> None:
            while queue:
                body = {"sentences": queue.pop()}
                t0 = time.perf_counter()
                r = await c.post("/translate", json=body)
                lat.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise RuntimeError(f"service answered {r.status_code}: {r.text[:200]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        seconds = time.perf_counter() - t0
    return sum(len(r) for r in reqs) / seconds, lat


def direct(translator, options, reqs: list[list[str]], batch: int) -> float:
    """Sentences/s of the model called directly on the same sentences, ``batch`` at a time."""
    flat = [s for r in reqs for s in r]
    t0 = time.perf_counter()
    for i in range(0, len(flat), batch):
        translator.translate(flat[i : i + batch], options, long="split")
    return len(flat) / (time.perf_counter() - t0)


def direct_latency(translator, options, sentences: list[str]) -> list[float]:
    out = []
    for s in sentences:
        t0 = time.perf_counter()
        translator.translate([s], options, long="split")
        out.append((time.perf_counter() - t0) * 1000)
    return out


def direct_request_latency(translator, options, reqs: list[list[str]]) -> list[float]:
    """Per-request latency (ms) of the model called directly, one request's sentences per call."""
    out = []
    for r in reqs:
        t0 = time.perf_counter()
        translator.translate(r, options, long="split")
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def export_revision(rev: str, dst: Path) -> Path:
    """The tree of git revision ``rev`` of this repository, unpacked into ``dst`` (no git state touched)."""
    dst.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    return dst


def service_command(root: Path | None, args: argparse.Namespace, port: int, log: Path,
                    extra: str = "") -> tuple[list[str], dict[str, str] | None]:
    """``(command, environment)`` of ``aiayn serve`` of this checkout (``root`` None: this venv's ``aiayn``, this
    environment, with the flags ``extra``) or of the exported tree ``root`` (``python -m aiayn`` with
    ``PYTHONPATH`` on that tree, which Python searches before this checkout's editable install)."""
    serve = ["serve", "--bundle", str(args.bundle), "--port", str(port), "--poll-s", "0",
             "--max-batch-sentences", str(args.max_batch_sentences), "--max-wait-ms", str(args.max_wait_ms),
             "--workers", str(args.workers), "--threads", str(args.threads), "--log-path", str(log)]
    if root is None:
        return [str(BIN / "aiayn"), *serve, *extra.split()], None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "src"), str(root), os.environ.get("PYTHONPATH")]))}
    return [sys.executable, "-m", "aiayn", *serve, *extra.split()], env


def before_after(args: argparse.Namespace, lines: list[str], tmp: Path) -> int:
    """``--before REV``: the two services, alternating rounds; prints the comparison table."""
    old_root = None if args.before == "." else export_revision(args.before, tmp / "before")
    sides = {}
    try:
        for name, root, extra in (("before", old_root, args.before_args), ("after", None, args.serve_args)):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd, env = service_command(root, args, port, tmp / f"{name}.db", extra)
            sides[name] = (start_service(cmd, url, tmp / f"{name}.log", env=env), url)
        for _, url in sides.values():  # warm-up of both
            asyncio.run(run_clients(url, requests_for(lines, 20, 0), 4))
        rows = []
        for clients in args.clients:
            got = {"before": ([], []), "after": ([], [])}
            n = max(args.requests, 2 * clients)
            for r in range(args.rounds):
                reqs = requests_for(lines, n, 1000 * clients + r, args.most)
                for name in round_order(["before", "after"], r):
                    sps, lat = asyncio.run(run_clients(sides[name][1], reqs, clients))
                    got[name][0].append(sps)
                    got[name][1].extend(lat)
                print(f"clients {clients} round {r}: before {got['before'][0][-1]:.1f} sent/s, "
                      f"after {got['after'][0][-1]:.1f} sent/s", file=sys.stderr)
            rows.append((clients, got))
    finally:
        for server, _ in sides.values():
            stop_service(server)
    after = f"this checkout with {args.serve_args}" if args.serve_args else "this checkout"
    before = "this checkout" if args.before == "." else f"git {args.before}"
    before += f" with {args.before_args}" if args.before_args else ""
    print(f"Before = {before}, after = {after}. Requests of 1-{args.most} sentences, {args.rounds} "
          f"alternating rounds of {args.requests} requests (at least 2 per client); bundle {args.bundle}; service: "
          f"max batch {args.max_batch_sentences}, max wait {args.max_wait_ms} ms, workers {args.workers}, "
          f"threads {args.threads}. sent/s: median (min-max) of the rounds; p95 over every request of the rounds.")
    print(host_line() + "\n")
    table = []
    for clients, got in rows:
        (bs, bl), (as_, al) = got["before"], got["after"]
        before, after_ = Spread.of(bs), Spread.of(as_)
        table.append([clients, f"{before:.1f}", f"{after_:.1f}", f"{after_.median / before.median:.2f}",
                      f"{pct(bl, 95):.0f}", f"{pct(al, 95):.0f}"])
    print(markdown_table(["clients", "before sent/s", "after sent/s", "after / before", "before p95 ms",
                          "after p95 ms"], table, "rrrrrr"))
    return 0


def service_vs_direct(args: argparse.Namespace, lines: list[str], url: str, translator, options) -> tuple:
    """``(rows, single, same)``: per client count ``(clients, service sent/s, direct sent/s, their per-round ratios,
    request latencies)`` over alternating rounds; the direct single-sentence latencies; the direct per-request ones."""
    direct_latency(translator, options, lines[:50])  # warm-up of both sides
    asyncio.run(run_clients(url, requests_for(lines, 20, 0), 4))
    rows = []
    for clients in args.clients:
        svc, drc, lat_all = [], [], []
        n = max(args.requests, 2 * clients)
        for r in range(args.rounds):
            reqs = requests_for(lines, n, 1000 * clients + r, args.most)
            for side in round_order(["service", "direct"], r):
                if side == "service":
                    sps, lat = asyncio.run(run_clients(url, reqs, clients))
                    svc.append(sps)
                    lat_all += lat
                else:
                    drc.append(direct(translator, options, reqs, args.max_batch_sentences))
            print(f"clients {clients} round {r}: service {svc[-1]:.1f} sent/s, direct {drc[-1]:.1f} sent/s", file=sys.stderr)
        rows.append((clients, svc, drc, ratios(svc, drc), lat_all))
    single = direct_latency(translator, options, lines[:100])
    same = direct_request_latency(translator, options, requests_for(lines, max(args.requests, 2), 1000, args.most))
    return rows, single, same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=REPO / "artifacts" / "export")
    ap.add_argument("--sources", type=Path, default=REPO / "artifacts" / "prepared" / "test_2016_flickr.en")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 100])
    ap.add_argument("--most", type=int, default=8, help="sentences per request: 1..MOST")
    ap.add_argument("--requests", type=int, default=120, help="requests per client count and round (at least 2 per client)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-batch-sentences", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--server", choices=("aiayn", "litserve"), default="aiayn")
    ap.add_argument("--no-log", action="store_true", help="litserve only: without the durable request log")
    ap.add_argument("--before", metavar="REV", help="compare with the service of git revision REV (see above)")
    ap.add_argument("--serve-args", default="", help="with --before: more `aiayn serve` flags for this checkout's "
                    "service, e.g. --serve-args=--no-scores")
    ap.add_argument("--before-args", default="", help="with --before: `aiayn serve` flags of the before side only, "
                    "e.g. --before-args=--no-output-signals")
    args = ap.parse_args(argv)

    lines = [x for x in args.sources.read_text(encoding="utf-8").splitlines() if x.strip()]
    if args.before:
        return before_after(args, lines, Path(tempfile.mkdtemp(prefix="aiayn-serve-load-")))
    from aiayn.inference.load import BundlePredictor

    bundle = BundlePredictor(args.bundle, threads=args.threads * args.workers)
    translator, info, options = bundle.translator, bundle.info, bundle.options
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="aiayn-serve-load-"))
    cmd = [str(BIN / "aiayn"), "serve", "--bundle", str(args.bundle), "--port", str(port), "--poll-s", "0",
           "--max-batch-sentences", str(args.max_batch_sentences), "--max-wait-ms", str(args.max_wait_ms),
           "--workers", str(args.workers), "--threads", str(args.threads), "--log-path", str(tmp / "requests.db")]
    if args.server == "litserve":
        cmd = [sys.executable, str(REPO / "benchmarks" / "perf" / "litserve_server.py"), "--bundle", str(args.bundle),
               "--port", str(port), "--max-batch-requests", str(max(1, args.max_batch_sentences // 4)),
               "--batch-timeout-ms", str(args.max_wait_ms), "--threads", str(args.threads * args.workers)]
        if not args.no_log:  # like for like: the same durable request log as aiayn serve
            cmd += ["--log-path", str(tmp / "requests.db")]
    server = start_service(cmd, url, tmp / "serve.log")
    try:
        rows, single, same = service_vs_direct(args, lines, url, translator, options)
    finally:
        stop_service(server)

    print(f"Server: {args.server}. Requests of 1-{args.most} sentences; bundle {args.bundle} ({info['variant']}, {info['runtime']}); "
          f"decode {info['decode']}; service: max batch {args.max_batch_sentences} sentences, max wait "
          f"{args.max_wait_ms} ms, workers {args.workers}, threads {args.threads}; {args.rounds} alternating rounds.")
    print(host_line() + "\n")
    print(markdown_table(["clients", "service sent/s (min-max)", "direct batch sent/s (min-max)",
                          "service / direct (min-max)", "p50 ms", "p95 ms", "p99 ms"],
                         [[clients, f"{Spread.of(svc):.1f}", f"{Spread.of(drc):.1f}", f"{Spread.of(per_round):.2f}",
                           f"{pct(lat, 50):.0f}", f"{pct(lat, 95):.0f}", f"{pct(lat, 99):.0f}"]
                          for clients, svc, drc, per_round, lat in rows], "rrrrrrr"))
    print(f"\nDirect, one call per request of the 1-client row's first round ({len(same)} requests of 1-{args.most} sentences): "
          f"p50 {pct(same, 50):.1f} ms, p95 {pct(same, 95):.1f} ms, p99 {pct(same, 99):.1f} ms.")
    print(f"Direct single-sentence latency (100 sentences, one call each): p50 {pct(single, 50):.1f} ms, "
          f"p95 {pct(single, 95):.1f} ms, p99 {pct(single, 99):.1f} ms.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
