"""``GET /v1/threads/{id}/export?format=markdown|jsonl`` (docs/api.md §4.23): a thread as
a document to keep or share. Both are streamed: the transcript is read from the store a
page at a time (each page bounded like a replay's, base.PAGE_BYTES) and sent as it is
read, so a huge thread never sits whole in memory.

* ``jsonl``: the exact transcript, one stored event envelope a line, byte for byte what a
  replay sends (``GET /v1/threads/{id}/events``' events, the WebSocket's frames in events
  mode), ``raw`` included.
* ``markdown``: the compacted history rendered for a reader (bridge/sessions/export.py).

Either covers the events committed when each page is read: an export taken while the
agent works ends at some event of the turn in flight.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from bridge.api.auth import require_auth
from bridge.api.context import context
from bridge.api.users import check_owner, current_user
from bridge.sessions.conversation import Conversation
from bridge.sessions.export import MarkdownExport, header

PAGE = 1000  # events a store read (and at most base.PAGE_BYTES of them)

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


async def _jsonl(conv: Conversation) -> AsyncIterator[bytes]:
    after = 0
    while True:
        frames = await conv.journal.read_frames(after, PAGE, raw=False)
        if frames.count:
            yield b"\n".join(frames.texts) + b"\n"
        after = frames.last
        if not frames.more or not frames.count:
            return


async def _markdown(conv: Conversation) -> AsyncIterator[bytes]:
    journal = conv.journal
    doc = MarkdownExport()
    yield header(dict(conv.thread)).encode()
    after = 0
    while True:
        page = await journal.store.read_events(journal.id, after, PAGE, with_raw=False)
        records = list(page)
        if records:
            text = doc.feed(records)
            if text:
                yield text.encode(errors="replace")
            after = records[-1].seq
        if not page.more or not records:
            break
    yield doc.finish().encode(errors="replace")


@router.get("/threads/{thread_id}/export")
async def export_thread(
    thread_id: str,
    request: Request,
    format: Literal["markdown", "jsonl"] = Query("markdown"),
) -> StreamingResponse:
    conv = await context(request).registry.get(thread_id)
    check_owner(current_user(request), thread_id, conv.thread.get("owner"))
    if format == "jsonl":
        body, media, ext = _jsonl(conv), "application/x-ndjson", "jsonl"
    else:
        body, media, ext = _markdown(conv), "text/markdown; charset=utf-8", "md"
    disposition = f'attachment; filename="{thread_id}.{ext}"'
    return StreamingResponse(body, media_type=media, headers={"Content-Disposition": disposition})
