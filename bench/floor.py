"""What a Python relay costs with nothing else to do: the floor under bench row 1.

``python -m bench.floor`` runs three relays of the same flood agent, interleaved run by run,
and prints lines/s and CPU per line for each, with ratios:

* websocketd, as in ``python -m bench``;
* the floor: ``python -m bench.floor relay`` — one asyncio process that does only what
  every relay must (read the agent's stdout, split lines, frame them as WebSocket text
  frames with the bridge's own framing, write them), and no decoding, no transcript, no
  fan-out;
* the bridge in raw mode (row 1: decode, the durable transcript, the fan-out).

The floor is not a product: it answers whether row 1's goal (the bridge at 1.0× websocketd)
is within reach of a Python asyncio daemon on this machine at all, and how much of the
bridge's time per line is the relay itself and how much is the transcript (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.run import (
    FLOOD,
    HOST,
    PYTHON,
    RESULT_MARK,
    Bridge,
    Websocketd,
    connect_retry,
    free_port,
    until,
    until_lines,
    user_line,
)
from bench.wsclient import WSClient
from bridge.api.ws_transport import frames

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
READ = 65536


def _unmask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    repeated = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")


async def _client_lines(reader: asyncio.StreamReader) -> list[bytes] | None:
    """One client frame's payload as a line for the agent (text frames only; None at a
    close frame or EOF). Enough for the bench client, which sends small masked frames."""
    with contextlib.suppress(asyncio.IncompleteReadError):
        head = await reader.readexactly(2)
        n = head[1] & 0x7F
        if n == 126:
            n = int.from_bytes(await reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await reader.readexactly(8), "big")
        key = await reader.readexactly(4)
        payload = _unmask(await reader.readexactly(n), key)
        return None if head[0] & 0x0F == 8 else [payload]
    return None


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await reader.readuntil(b"\r\n\r\n")
    found = re.search(rb"(?im)^sec-websocket-key:\s*(\S+)", request)
    if found is None:
        writer.close()
        return
    accept = base64.b64encode(hashlib.sha1(found.group(1) + GUID).digest())  # noqa: S324 (RFC 6455)
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )
    proc = await asyncio.create_subprocess_exec(
        PYTHON, "-I", str(FLOOD), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def out() -> None:
        rest = b""
        while chunk := await stdout.read(READ):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if lines:
                writer.write(frames(lines))
                await writer.drain()

    relay = asyncio.create_task(out())
    try:
        while (lines := await _client_lines(reader)) is not None:
            for line in lines:
                stdin.write(line + b"\n")
            await stdin.drain()
    finally:
        stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await relay
        writer.close()


async def relay(port: int) -> None:
    server = await asyncio.start_server(_serve, HOST, port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


class Floor:
    """``python -m bench.floor relay`` in a subprocess."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self) -> None:
        self.port = free_port()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.floor",
            "relay",
            "--port",
            str(self.port),
            cwd=str(Path(__file__).parent.parent),
        )
        ws = await connect_retry(self.port, "/", {}, time.perf_counter() + 30, self.proc)
        await ws.close()

    async def ws(self) -> WSClient:
        return await WSClient.connect(HOST, self.port, "/")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 10)


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant (the agents, the store writer)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


async def flood(ws: WSClient, lines: int, size: int, pid: int) -> tuple[float, float]:
    """A warm-up turn, then the flood: (lines/s, CPU µs per line of the server's tree)."""
    await ws.send_text(user_line("flood 1"))
    await until(ws, RESULT_MARK)
    c0, t0 = tree_cpu(pid), time.perf_counter()
    await ws.send_text(user_line(f"flood {lines} {size}"))
    got = await until_lines(ws, RESULT_MARK)
    dt = time.perf_counter() - t0
    cpu = tree_cpu(pid) - c0
    await ws.close()
    assert got == lines + 2, got
    return lines / dt, cpu / lines * 1e6


async def measure(runs: int, lines: int, size: int) -> dict[str, list[tuple[float, float]]]:
    work = Path(tempfile.mkdtemp(prefix="agent-bridge-floor-"))
    wsd, floor, bridge = Websocketd(FLOOD, work / "websocketd"), Floor(), Bridge(work / "bridge")
    await wsd.start()
    await floor.start()
    await bridge.start()
    out: dict[str, list[tuple[float, float]]] = {"websocketd": [], "floor": [], "bridge": []}
    try:
        async with bridge.http() as http:
            tid = await bridge.new_thread(http, "flood")

            async def on_bridge() -> tuple[float, float]:
                ws = await bridge.ws(tid, mode="raw", after=await bridge.last_seq(http, tid))
                return await flood(ws, lines, size, bridge.pid)

            async def on_wsd() -> tuple[float, float]:
                return await flood(await wsd.ws(), lines, size, wsd.pid)

            async def on_floor() -> tuple[float, float]:
                assert floor.proc is not None
                return await flood(await floor.ws(), lines, size, floor.proc.pid)

            jobs = {"websocketd": on_wsd, "floor": on_floor, "bridge": on_bridge}
            names = list(jobs)
            for r in range(runs):
                for name in names[r % 3 :] + names[: r % 3]:
                    out[name].append(await jobs[name]())
    finally:
        await bridge.stop()
        await floor.stop()
        await wsd.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def report(out: dict[str, list[tuple[float, float]]], runs: int, lines: int, size: int) -> str:
    med = {k: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v)) for k, v in out.items()}
    w, f, b = med["websocketd"], med["floor"], med["bridge"]
    rows = [
        f"bench.floor: {lines} lines of {size} B, medians of {runs} runs; load average {os.getloadavg()}",
        "",
        "| relay | lines/s | ÷ websocketd | CPU µs per line (server + agent + writer) |",
        "|---|---:|---:|---:|",
        f"| websocketd | {w[0]:,.0f} | 1.00× | {w[1]:.2f} |",
        f"| Python floor (read, split, frame, write) | {f[0]:,.0f} | {f[0] / w[0]:.2f}× | {f[1]:.2f} |",
        f"| bridge, raw mode | {b[0]:,.0f} | {b[0] / w[0]:.2f}× | {b[1]:.2f} |",
        "",
        f"bridge ÷ floor: {b[0] / f[0]:.2f}× the lines/s, "
        + (f"{b[1] / f[1]:.2f}× the CPU per line" if f[1] else "the floor's CPU below the clock's tick"),
    ]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("relay", help="run the floor relay (used by the measurement)")
    r.add_argument("--port", type=int, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "relay":
        asyncio.run(relay(args.port))
        return 0
    if shutil.which("websocketd") is None:
        ap.error("websocketd is not on PATH (Debian package websocketd: apt-get install websocketd)")
    out = asyncio.run(measure(args.runs, args.lines, 200))
    print(report(out, args.runs, args.lines, 200))
    if args.json:
        args.json.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
