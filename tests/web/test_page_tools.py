"""Tool cards (issue #21 item 3): collapsed to one line (tool, main argument, status,
duration), a shell command with its exit status, edits as unified diffs with line
numbers, long output cut with "Show all", images shown. Fed straight to the page's
TranscriptView in a real chromium, as the agents' shapes are (stream-json Edit / Write /
MultiEdit / Bash, ACP ``diff`` content)."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest
from playwright.async_api import Page, expect
from test_page_e2e import Session, browser, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


def ev(seq: int, event: str, ts: str, raw: Any = None, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "ts": f"2026-11-30T00:00:{ts}Z", "source": "agent", "kind": event, "data": data, "raw": raw}


def png() -> str:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    raw = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(b"\0\xff\0\0"))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + raw + chunk(b"IEND", b"")).decode()


OLD = "".join(f"line {i}\n" for i in range(1, 21))
LONG = "\n".join(f"row {i}" for i in range(500))
ACP_RAW = {
    "jsonrpc": "2.0",
    "method": "session/update",
    "params": {
        "sessionId": "s1",
        "update": {
            "sessionUpdate": "tool_call",
            "toolCallId": "a1",
            "title": "Edit b.txt",
            "kind": "edit",
            "content": [{"type": "diff", "path": "/w/b.txt", "oldText": "one\ntwo\n", "newText": "one\n2\n"}],
        },
    },
}
EVENTS = [
    ev(
        1,
        "tool.call",
        "01.000",
        tool_call_id="e1",
        name="Edit",
        input={"file_path": "/w/a.txt", "old_string": OLD, "new_string": OLD.replace("line 10\n", "line ten\n")},
    ),
    ev(2, "tool.result", "01.250", tool_call_id="e1", output="The file /w/a.txt has been updated.", is_error=False),
    ev(
        3,
        "tool.call",
        "02.000",
        tool_call_id="w1",
        name="Write",
        input={"file_path": "/w/new.txt", "content": "a\nb\n"},
    ),
    ev(
        4,
        "tool.call",
        "03.000",
        tool_call_id="m1",
        name="MultiEdit",
        input={
            "file_path": "/w/c.py",
            "edits": [{"old_string": "x = 1", "new_string": "x = 2"}, {"old_string": "y", "new_string": "y\nz"}],
        },
    ),
    ev(
        5,
        "tool.call",
        "04.000",
        tool_call_id="b1",
        name="Bash",
        input={"command": "ls -la /tmp\necho done", "description": "list"},
    ),
    ev(6, "tool.result", "06.500", tool_call_id="b1", output=LONG, is_error=False),
    ev(7, "tool.call", "07.000", tool_call_id="b2", name="Bash", input={"command": "false"}),
    ev(8, "tool.result", "07.100", tool_call_id="b2", output="Exit code 3\nboom", is_error=True),
    ev(9, "tool.call", "08.000", ACP_RAW, tool_call_id="a1", name="Edit", title="Edit b.txt", kind="edit", input=None),
    ev(10, "tool.call", "09.000", tool_call_id="s1", name="Screenshot", input={"url": "http://localhost/"}),
    ev(
        11,
        "tool.result",
        "10.000",
        tool_call_id="s1",
        is_error=False,
        output=[
            {"type": "text", "text": "captured"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png()}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/svg+xml", "data": "PHN2Zz4="}},
        ],
    ),
]


async def fed(page: Page) -> None:
    await page.evaluate(
        """async (events) => {
            const { TranscriptView } = await import('/assets/transcript.js');
            const box = document.createElement('div');
            box.id = 'fed';
            document.body.append(box);
            document.querySelector('#app').hidden = true;
            new TranscriptView(box).apply(events);
        }""",
        EVENTS,
    )


async def test_tool_cards_are_one_line_summaries_that_open_to_diffs_commands_and_output(web: Session) -> None:
    page = await web.page()
    await fed(page)
    cards = page.locator("#fed .tool")
    await expect(cards).to_have_count(7)
    # Collapsed by default, one line each: tool, main argument, status, duration.
    assert await cards.evaluate_all("cs => cs.map(c => c.open)") == [False] * 7
    edit = cards.nth(0)
    await expect(edit.locator(":scope > summary .tool-name")).to_have_text("Edit")
    await expect(edit.locator(":scope > summary .tool-arg")).to_have_text("/w/a.txt")
    await expect(edit.locator(":scope > summary .tool-status")).to_have_text("done")
    await expect(edit.locator(":scope > summary .tool-time")).to_have_text("250 ms")
    box = await edit.locator(":scope > summary").bounding_box()
    assert box is not None and box["height"] < 40, box
    await expect(edit.locator(".diff")).to_be_hidden()
    await edit.locator(":scope > summary").click()
    await expect(edit.locator(".diff")).to_be_visible()
    # A unified diff: 3 lines of context each side, both line numbers, one hunk.
    rows = await edit.locator(".diff-line").evaluate_all("rs => rs.map(r => [...r.children].map(c => c.textContent))")
    assert rows == [
        ["7", "7", " ", "line 7"],
        ["8", "8", " ", "line 8"],
        ["9", "9", " ", "line 9"],
        ["10", "", "-", "line 10"],
        ["", "10", "+", "line ten"],
        ["11", "11", " ", "line 11"],
        ["12", "12", " ", "line 12"],
        ["13", "13", " ", "line 13"],
    ]
    await expect(edit.locator(".diff-file")).to_have_text("/w/a.txt +1 −1")
    await expect(edit.locator(".tool-raw")).not_to_have_attribute("open", "")  # the JSON is one click away

    write = cards.nth(1)
    await write.locator(":scope > summary").click()
    await expect(write.locator(".diff-file")).to_have_text("/w/new.txt (new file) +2 −0")
    assert await write.locator(".diff-line").evaluate_all("rs => rs.map(r => r.textContent)") == ["1+a", "2+b"]
    await expect(write.locator(".tool-status")).to_have_text("running")  # no result yet

    multi = cards.nth(2)
    await expect(multi.locator(".diff-file")).to_have_count(2)
    assert await multi.locator(".diff-line").evaluate_all("rs => rs.map(r => r.className.split(' ')[1])") == [
        "diff-del",
        "diff-add",
        "diff-ctx",
        "diff-add",
    ]

    bash = cards.nth(3)
    await expect(bash.locator(":scope > summary .tool-arg")).to_have_text("ls -la /tmp")
    await expect(bash.locator(":scope > summary .tool-exit")).to_have_text("exit 0")
    await expect(bash.locator(":scope > summary .tool-time")).to_have_text("2.5 s")
    await bash.locator(":scope > summary").click()
    await expect(bash.locator(".tool-command")).to_have_text("$ ls -la /tmp\necho done")
    out = bash.locator(".tool-output")
    assert (await out.text_content() or "").split("\n") == [f"row {i}" for i in range(30)]
    more = bash.locator(".tool-more")
    await expect(more).to_have_text(f"Show all (500 lines, {len(LONG):,} characters)")
    await more.click()
    await expect(more).to_be_hidden()
    assert await out.text_content() == LONG

    failed = cards.nth(4)
    await expect(failed.locator(":scope > summary .tool-exit")).to_have_text("exit 3")
    await expect(failed.locator(":scope > summary .tool-status")).to_have_text("error")
    await expect(failed).to_have_class("tool error")

    acp = page.locator('#fed .tool[data-tool-call-id="a1"]')
    await expect(acp.locator(".tool-title")).to_have_text("Edit b.txt")
    assert await acp.locator(".diff-line").evaluate_all("rs => rs.map(r => r.textContent)") == [
        "11 one",
        "2-two",
        "2+2",
    ]
    web.assert_clean()


async def test_images_in_a_tool_result_are_shown_and_only_known_types(web: Session) -> None:
    page = await web.page()
    await fed(page)
    shot = page.locator('#fed .tool[data-tool-call-id="s1"]')
    await expect(shot.locator(".tool-output")).to_have_text("captured")
    await shot.locator(":scope > summary").click()
    imgs = shot.locator(".tool-images img")
    await expect(imgs).to_have_count(1)  # the SVG is not shown
    assert (await imgs.get_attribute("src") or "").startswith("data:image/png;base64,")
    await expect(imgs).to_have_attribute("alt", "Image returned by Screenshot")
    await page.wait_for_function("() => document.querySelector('#fed .tool-images img').naturalWidth === 1")
    web.assert_clean()
