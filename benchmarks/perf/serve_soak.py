"""Soak ``aiayn serve``: minutes of mixed valid, invalid, abandoned and stalled traffic.

    python benchmarks/perf/serve_soak.py --bundle artifacts/export --minutes 10 [--clients 16] [--log-url URL]

One ``aiayn serve`` process (its own process group; SQLite log in a temporary folder unless
``--log-url``), ``--clients`` asyncio clients drawing each request's kind with a fixed seed:

- ``valid`` (weight 70): 1-8 sentences of ``--sources``, beam 1-4, sometimes ``n_best``: must be 200;
- ``invalid`` (20): one of the hostile bodies (a 5,000-digit number, 1,000 nested arrays, a
  lone surrogate, an over-long sentence, wrong types, too many sentences, an oversized body, the
  wrong content type, malformed JSON): must be its 4xx, never a 5xx;
- ``abandoned`` (9): 32 sentences at beam 4, the client gone after 20-200 ms: the server must drop
  it (499) or, if it finished first, log it like any answer;
- ``stalled`` (1): headers and one byte of a body that never comes: must be 408 after
  ``--body-timeout-s``.

Every ``--sample-s`` the server's resident memory (RSS, psutil) is sampled. At the end the request
log is read through ``aiayn.serving.request_log``. Checks (exit status 1 when one fails):

- no 5xx, and every response had its kind's status;
- memory flat: the median RSS of the last fifth of the run within ``--rss-growth`` (10 %) of the
  median of the first fifth after ``--warmup-s``;
- row counts exact: logged requests == the server's own count of 200 answers; every request id a
  client got a 200 for is logged with all its sentences; the rest of the log is abandoned requests
  the server finished before it noticed the client was gone (at most the abandoned count).

Prints a markdown summary (and ``--json FILE``: the figures and the RSS samples). Results: docs/results.md,
"Soak: 10 minutes of mixed traffic".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks.harness import REPO, host_line, markdown_table
from benchmarks.local_service import free_port, start_service, stop_service

BIN = Path(sys.executable).parent
KINDS = {"valid": 70, "invalid": 20, "abandoned": 9, "stalled": 1}


def invalid_bodies(max_body_bytes: int) -> list[tuple[bytes, str, set[int]]]:
    """``(body, content type, acceptable statuses)`` of the hostile requests."""
    js = "application/json"
    return [
        (b'{"sentences":["A dog."],"beam_size":1' + b"0" * 5000 + b"}", js, {400}),
        (b'{"sentences": ' + b"[" * 1000 + b"]" * 1000 + b"}", js, {400}),
        (b'{"sentences":["\\ud800 A man rides a bike."]}', js, {400}),
        (b'{"sentences":["' + b"a" * 200_000 + b'"]}', js, {422}),
        (b'{"sentences":["a", 3]}', js, {422}),
        (json.dumps({"sentences": ["a man"] * 65}).encode(), js, {422}),
        (b'{"sentences":["a man"],"beam_size":0}', js, {422}),
        (b"{not json", js, {400}),
        (b'{"sentences":["' + b"a " * (max_body_bytes // 2) + b'"]}', js, {413}),
        (b'{"sentences":["a man"]}', "text/plain", {415}),
    ]


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, lines: list[str]) -> None:
        self.args, self.url, self.lines = args, url, lines
        self.rng = random.Random(args.seed)
        self.bad = invalid_bodies(args.max_body_bytes)
        self.status: Counter = Counter()  # (kind, status)
        self.wrong: list[str] = []
        self.answered: dict[str, int] = {}  # request id -> sentences, of every 200 a client received
        self.abandoned = 0

    async def valid(self, c: httpx.AsyncClient) -> None:
        body = {"sentences": [self.rng.choice(self.lines) for _ in range(self.rng.randint(1, 8))],
                "beam_size": self.rng.randint(1, 4)}
        if self.rng.random() < 0.2:
            body["n_best"] = self.rng.randint(1, body["beam_size"])
        r = await c.post("/translate", json=body)
        self._seen("valid", r.status_code, {200}, r.text)
        if r.status_code == 200:
            self.answered[r.json()["request_id"]] = len(body["sentences"])

    async def invalid(self, c: httpx.AsyncClient) -> None:
        body, ctype, ok = self.rng.choice(self.bad)
        r = await c.post("/translate", content=body, headers={"content-type": ctype})
        self._seen("invalid", r.status_code, ok, r.text)

    async def abandoned_request(self, c: httpx.AsyncClient) -> None:
        body = {"sentences": [self.rng.choice(self.lines) for _ in range(32)], "beam_size": 4}
        self.abandoned += 1
        try:
            r = await c.post("/translate", json=body, timeout=self.rng.uniform(0.02, 0.2))
        except httpx.TimeoutException:
            self.status[("abandoned", "gone")] += 1
            return
        self._seen("abandoned", r.status_code, {200}, r.text)  # finished before the client gave up
        if r.status_code == 200:
            self.answered[r.json()["request_id"]] = 32

    async def stalled(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(self.url.rsplit(":", 1)[1]))
        writer.write(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), self.args.body_timeout_s + 30)
        writer.close()
        status = int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0
        self._seen("stalled", status, {408}, line.decode(errors="replace"))

    def _seen(self, kind: str, status: int, ok: set[int], text: str) -> None:
        self.status[(kind, status)] += 1
        if status not in ok:
            self.wrong.append(f"{kind}: {status} {text[:160]}")

    async def client(self, deadline: float) -> None:
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as c:
            while time.monotonic() < deadline:
                kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
                try:
                    if kind == "valid":
                        await self.valid(c)
                    elif kind == "invalid":
                        await self.invalid(c)
                    elif kind == "abandoned":
                        await self.abandoned_request(c)
                    else:
                        await self.stalled()
                except (httpx.HTTPError, OSError, asyncio.TimeoutError) as e:
                    self.wrong.append(f"{kind}: {type(e).__name__}: {e}")


async def sample_rss(pid: int, every_s: float, deadline: float, out: list[tuple[float, float]]) -> None:
    import psutil

    proc, t0 = psutil.Process(pid), time.monotonic()
    while time.monotonic() < deadline:
        out.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
        await asyncio.sleep(every_s)


def metric(url: str, name: str) -> dict[str, float]:
    """label set -> value of a Prometheus counter on the service's /metrics."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, value = line.rsplit(" ", 1)
            out[key[len(name):]] = float(value)
    return out


def checks(soak: Soak, rss: list[tuple[float, float]], metrics: dict, logged: dict[str, int],
           args: argparse.Namespace) -> tuple[list[str], dict]:
    """The soak's verdicts (an empty list: all passed) and its figures."""
    failed = list(soak.wrong[:20])
    fives = {k: v for k, v in metrics["requests"].items() if k.startswith('{status="5')}
    if fives:
        failed.append(f"5xx answers: {fives}")
    served = metrics["requests"].get('{status="200"}', 0.0)
    if len(logged) != served:
        failed.append(f"{len(logged)} requests logged, the server answered {served:g} with 200")
    missing = [rid for rid, n in soak.answered.items() if logged.get(rid) != n]
    if missing:
        failed.append(f"{len(missing)} answered requests not logged exactly (e.g. {missing[:3]})")
    extra = len(logged) - len(soak.answered)
    if not 0 <= extra <= soak.abandoned:
        failed.append(f"{extra} logged requests no client saw answered (abandoned: {soak.abandoned})")
    steady = [m for t, m in rss if t >= args.warmup_s]
    fifth = max(1, len(steady) // 5)
    first, last = statistics.median(steady[:fifth]), statistics.median(steady[-fifth:])
    growth = last / first - 1
    if growth > args.rss_growth:
        failed.append(f"memory grew {growth:.1%} (RSS {first:.0f} -> {last:.0f} MiB)")
    figures = {"requests_by_kind_status": {f"{k}:{s}": n for (k, s), n in sorted(soak.status.items(), key=str)},
               "server_requests_by_status": metrics["requests"], "logged_requests": len(logged),
               "logged_sentences": sum(logged.values()), "client_200": len(soak.answered),
               "abandoned_sent": soak.abandoned, "abandoned_logged": extra,
               "rss_mib_first_fifth": round(first, 1), "rss_mib_last_fifth": round(last, 1),
               "rss_growth": round(growth, 4), "rss_mib_max": round(max(m for _, m in rss), 1)}
    return failed, figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=REPO / "artifacts" / "export")
    ap.add_argument("--sources", type=Path, default=REPO / "artifacts" / "prepared" / "test_2016_flickr.en")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-url", help="PostgreSQL request log (default: SQLite in a temporary folder)")
    ap.add_argument("--max-body-bytes", type=int, default=256 * 1024)
    ap.add_argument("--body-timeout-s", type=float, default=10.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--rss-growth", type=float, default=0.10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.warmup_s = min(args.warmup_s, args.minutes * 60 / 5)  # short runs keep most of their samples

    from aiayn.serving.request_log import open_request_log

    lines = [x for x in args.sources.read_text(encoding="utf-8").splitlines() if x.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="aiayn-serve-soak-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_target = args.log_url or str(tmp / "requests.db")
    cmd = [str(BIN / "aiayn"), "serve", "--bundle", str(args.bundle), "--port", str(port), "--poll-s", "0",
           "--max-body-bytes", str(args.max_body_bytes), "--body-timeout-s", str(args.body_timeout_s),
           *(["--log-url", args.log_url] if args.log_url else ["--log-path", log_target])]
    server = start_service(cmd, url, tmp / "serve.log")
    try:
        soak, rss = Soak(args, url, lines), []
        end = time.monotonic() + args.minutes * 60

        async def run() -> None:
            await asyncio.gather(sample_rss(server.pid, args.sample_s, end, rss),
                                 *(soak.client(end) for _ in range(args.clients)))

        t0 = time.monotonic()
        asyncio.run(run())
        seconds = time.monotonic() - t0
        time.sleep(2.0)  # abandoned requests still decoding finish (dropped or logged)
        metrics = {"requests": metric(url, "aiayn_requests_total"), "errors": metric(url, "aiayn_errors_total")}
        with open_request_log(log_target, read_only=not args.log_url) as request_log:
            logged = request_log.request_ids()
    finally:
        stop_service(server)
    failed, figures = checks(soak, rss, metrics, logged, args)
    figures.update(seconds=round(seconds, 1), clients=args.clients, bundle=str(args.bundle),
                   log=args.log_url and "postgresql" or "sqlite", server_errors_by_kind=metrics["errors"])
    print(f"Soak: {seconds / 60:.1f} min, {args.clients} clients, mix {KINDS}, bundle {args.bundle}, "
          f"log {figures['log']}.")
    print(host_line() + "\n")
    print(markdown_table(["figure", "value"], [[k, json.dumps(v) if isinstance(v, dict) else v] for k, v in figures.items()
                                               if k not in ("bundle", "clients", "seconds", "log")]))
    print("\n" + ("PASS" if not failed else "FAIL:\n- " + "\n- ".join(failed)))
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "failed": failed, "rss_mib": rss}, indent=1))
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
