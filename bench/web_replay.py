"""How long the web page takes to rebuild a long transcript after a reload, as a ratio
against a peer measured in the same run: a Python WebSocket client reading the same
transcript from ``after=0`` (the fastest a client can receive it).

    .venv/bin/python bench/web_replay.py [--deltas 20000] [--rounds 3]

The daemon is the benchmark's own (``bench.run.Bridge``, the flood agent of bench/agents/);
nothing here depends on tests/. Needs Debian's chromium (/usr/bin/chromium) and the test
extras (Playwright). Prints the median of each side and page / peer; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import websockets
from playwright.async_api import async_playwright

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.run import HOST, TOKEN, Bridge

CHROMIUM = "/usr/bin/chromium"


async def main(deltas: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_s:
        d = Bridge(Path(tmp_s))
        await d.start()
        url, ws_url = f"http://{HOST}:{d.port}", f"ws://{HOST}:{d.port}"
        try:
            async with d.http() as http:
                tid = await d.new_thread(http, "flood")
                # bench/agents/flood_agent.py: ``deltas`` text deltas of the smallest size, one result
                r = await http.post(f"/v1/threads/{tid}/messages", json={"text": f"flood {deltas} 0"})
                r.raise_for_status()
                while True:
                    thread = (await http.get(f"/v1/threads/{tid}")).json()
                    if not thread["turn_active"] and thread["last_seq"] > deltas:
                        break
                    await asyncio.sleep(0.1)
            last = thread["last_seq"]

            peer: list[float] = []
            page_times: list[float] = []
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
                )
                page = await (await browser.new_context()).new_page()
                await page.goto(f"{url}/")
                await page.fill("#token", TOKEN)
                await page.press("#token", "Enter")
                await page.wait_for_selector("#app:not([hidden])")
                await page.goto(f"{url}/#t={tid}")
                await page.wait_for_selector(".turn-end", timeout=300_000)
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    async with websockets.connect(
                        f"{ws_url}/v1/threads/{tid}/ws?after=0", additional_headers=d.headers, max_size=None
                    ) as ws:
                        for _ in range(last):
                            await ws.recv()
                    peer.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    await page.reload()
                    await page.wait_for_selector(".turn-end", timeout=300_000)
                    page_times.append(time.perf_counter() - t0)
                await browser.close()
        finally:
            await d.stop()
    p, q = statistics.median(page_times), statistics.median(peer)
    print(f"transcript: {last} events ({deltas} deltas in one reply)")
    print(f"page reload to a rebuilt transcript: median {p:.2f} s  {[round(x, 2) for x in page_times]}")
    print(f"peer (python websockets, after=0):   median {q:.2f} s  {[round(x, 2) for x in peer]}")
    print(f"page / peer: {p / q:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deltas", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.deltas, a.rounds))
